"""The front ends: the click CLI (and, later, the Textual dashboard)."""
