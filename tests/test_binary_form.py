"""docs/protocol.md#wit binary-form claim: a controller is the canonical-ABI lowering of world `controller`,
so wasm-tools turns it into a component against wit/aici.wit."""
from __future__ import annotations

import subprocess
from pathlib import Path

import _require as require

ROOT = Path(__file__).resolve().parent.parent


@require.tool("wasm-tools")
def test_scripted_controller_becomes_a_component(scripted_wasm, tmp_path):
    embedded, component = tmp_path / "embedded.wasm", tmp_path / "component.wasm"
    subprocess.run(["wasm-tools", "component", "embed", str(ROOT / "wit"), "--world", "controller",
                    str(scripted_wasm), "-o", str(embedded)], check=True)
    subprocess.run(["wasm-tools", "component", "new", str(embedded), "-o", str(component)], check=True)
    wit = subprocess.run(["wasm-tools", "component", "wit", str(component)], check=True, capture_output=True, text=True)
    assert "export mid-process: func(arg: mid-process-arg) -> mid-process-result;" in wit.stdout
    assert "import aici:controller/host@0.1.0;" in wit.stdout
