"""The rules: states, durations, names, labels, TTLs, errors and exit codes, the profile
schema and the settings they read. No database, no backend."""
