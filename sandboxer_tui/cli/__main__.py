"""`python -m sandboxer_tui.cli`: the command line in this process, never handed to an
`sbx server` (`python -m sandboxer_tui` is `sbx` itself)."""

from sandboxer_tui.cli import main

if __name__ == "__main__":
    main()
