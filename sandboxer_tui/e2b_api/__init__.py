"""A self-hosted E2B (docs/e2b-api.md): E2B's control plane (`/sandboxes`, `/v2/sandboxes`)
and envd (Connect RPC `process.Process`, `filesystem.Filesystem`, `/files`) spoken to the
unmodified `e2b` SDK, each call mapped onto the public library (`AsyncSandboxer`,
`AsyncSandbox`, its `files` and `processes`). A front-end room of its own: it knows nothing
of the service that mounts it (`sbx serve` at /e2b: sandboxer_tui/service/e2b.py), which
hands it the caller's client. It imports no `e2b`: the wire is JSON (the SDK's envd codec is
protobuf's JSON mapping), written here."""
