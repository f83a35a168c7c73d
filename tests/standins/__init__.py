"""Local stand-ins for cloud backends: real servers on 127.0.0.1 speaking the backends' own
protocols, so the real SDKs are tested end to end without the internet."""
