"""Modules in: Wasm parsing and checks (`wasm_binary`, `wasm_code`), compiling in a killable child
(`compile_worker`), a controller's first-call admission, JavaScript bundles (`js_bind`), and the
per-tokenizer init snapshots (`snapshot`). Below the core; above the host and native layers."""
