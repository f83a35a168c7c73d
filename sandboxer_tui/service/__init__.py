"""`sbx serve`: the library over HTTP (docs/service.md). FastAPI on uvicorn; the routes
(routes/, one module per resource) parse, call the library (`sandboxer` and
`sandboxer.service`) and show, as the CLI's commands do. Loaded only by `sbx serve`: the
CLI's fast paths import none of it."""
