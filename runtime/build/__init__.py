"""Building controllers: the toolchain (`zig cc` to wasm32), recipes (`build.json`, libraries a
controller names) and the JavaScript/TypeScript checks (`js_tools`). Above the core."""
