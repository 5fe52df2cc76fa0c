"""What the host grants a controller: the host-import table (`host_imports`), WASI (`wasi`), and
the tokenizer and its token trie (`tokenizer`, `toktrie`). Above the native layer, below the loader."""
