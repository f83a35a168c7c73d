"""The dashboard's screens: the main view and its modals (confirmation, pickers, exec, help)."""
