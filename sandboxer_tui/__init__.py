"""The front ends over the library: the click CLI, the Textual dashboard, the HTTP service
(`sbx serve`), and `sbx server` with its launchers."""
