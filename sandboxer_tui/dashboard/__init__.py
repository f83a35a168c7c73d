"""The Textual dashboard (`sbx tui`, or `sbx` alone on a terminal): `app.py` draws,
`model.py` reads and acts through the library, `screens/` and `widgets/` are its parts."""
