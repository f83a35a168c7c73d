"""The front ends over the library, each in a room of its own: the click CLI (cli/), the
Textual dashboard (dashboard/), the HTTP service of `sbx serve` (service/), and the resident
server of `sbx server` with the `sbx` entry point (resident/). `python -m sandboxer_tui` is
`sbx`. Empty on purpose: the entry point imports only built-in modules."""
