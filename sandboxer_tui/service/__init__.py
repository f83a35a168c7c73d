"""`sbx serve`: the library over HTTP (docs/service.md). FastAPI on uvicorn; the routes parse,
call `sandboxer.AsyncSandboxer` and show, as the CLI's commands do. Loaded only by
`sbx serve`: the CLI's fast paths import none of it."""
