"""`python -m sandboxer_tui` is `sbx`: the same entry point pip's `sbx` script runs."""

from sandboxer_tui.resident.launcher import main

if __name__ == "__main__":
    main()
