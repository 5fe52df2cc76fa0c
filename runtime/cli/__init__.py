"""The `aicirt` command (`main`: the repository's cli.py, linked here so it ships in the package).
The top layer: it only parses options and calls the layers below."""
