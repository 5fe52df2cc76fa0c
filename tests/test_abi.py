"""abi.py's layouts derived independently from wit/aici.wit with the canonical ABI's rules."""
from __future__ import annotations

import re
from pathlib import Path

from aicirt import abi

WIT = (Path(__file__).resolve().parents[1] / "wit" / "aici.wit").read_text()
PRIMS = {"u8": (1, 1), "u32": (4, 4), "f32": (4, 4), "token-id": (4, 4), "seq-id": (4, 4)}


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def records() -> dict[str, list[tuple[str, str]]]:
    out = {}
    for name, body in re.findall(r"record\s+([\w-]+)\s*\{(.*?)\}", WIT, re.S):
        fields = []
        for line in body.splitlines():
            line = line.split("//")[0].strip().rstrip(",")
            if ":" in line:
                field, ty = (p.strip() for p in line.split(":", 1))
                fields.append((field, ty))
        out[name] = fields
    out["token-set"] = [("", "list<u32>")]   # type alias
    return out


def size_align(ty: str, recs) -> tuple[int, int]:
    if ty in PRIMS:
        return PRIMS[ty]
    if ty.startswith("list<"):
        return 8, 4
    if ty.startswith("option<"):
        inner = ty[len("option<"):-1]
        if inner == "token-set":
            inner = "list<u32>"
        s, a = size_align(inner, recs)
        return _align(_align(1, a) + s, a), a
    return layout(ty, recs)[1:]


def layout(name: str, recs) -> tuple[dict[str, int], int, int]:
    """(field offsets, size, alignment) of a record."""
    offsets, off, align = {}, 0, 1
    for field, ty in recs[name]:
        s, a = size_align(ty, recs)
        off = _align(off, a)
        offsets[field] = off
        off += s
        align = max(align, a)
    return offsets, _align(off, align), align


def test_branch_and_splice_layouts_match_the_wit():
    recs = records()
    branch, size, _ = layout("branch", recs)
    assert size == abi.BRANCH_SIZE
    assert branch["sample-mask"] == abi.BRANCH_MASK_TAG and abi.BRANCH_MASK_PTR == abi.BRANCH_MASK_TAG + 4
    assert abi.BRANCH_MASK_LEN == abi.BRANCH_MASK_PTR + 4
    assert branch["temperature"] == abi.BRANCH_TEMP_TAG and abi.BRANCH_TEMP_VALUE == abi.BRANCH_TEMP_TAG + 4
    assert branch["splices"] == abi.BRANCH_SPLICES_PTR and abi.BRANCH_SPLICES_LEN == abi.BRANCH_SPLICES_PTR + 4
    splice, size, _ = layout("splice", recs)
    assert size == abi.SPLICE_SIZE
    assert (splice["when-sampled"], splice["backtrack"], splice["ff-tokens"]) == \
        (abi.SPLICE_WHEN_PTR, abi.SPLICE_BACKTRACK, abi.SPLICE_FF_PTR)
    assert abi.SPLICE_WHEN_LEN == abi.SPLICE_WHEN_PTR + 4 and abi.SPLICE_FF_LEN == abi.SPLICE_FF_PTR + 4
    assert layout("mid-process-result", recs)[1] == abi.RESULT_SIZE
    assert size_align("option<list<u8>>", recs)[0] == abi.OPTION_LIST_SIZE


def test_host_imports_are_the_wit_interface_host():
    host = re.search(r"interface host \{(.*?)\n\}", WIT, re.S).group(1)
    names = re.findall(r"^\s*([\w-]+): func", host, re.M)
    assert names == list(abi.HOST_IMPORTS)
    assert set(abi.NATIVE_IMPORTS) <= set(abi.HOST_IMPORTS)


def test_the_c_header_carries_every_layout_and_status():
    header = abi.c_header()
    for name in ("BRANCH_SIZE", "SPLICE_SIZE", "BRANCH_MASK_PTR", "RESULT_SIZE"):
        assert f"#define ABI_{name} {getattr(abi, name)}\n" in header
    for status in abi.Status:
        assert f"#define AICIRT_{status.name} ({status.value})\n" in header
    for i, name in enumerate(abi.HOST_IMPORTS):
        assert f"#define HOST_{name.upper().replace('-', '_')} {i}\n" in header
    # the C sources use the generated names, not numbers of their own
    native = Path(abi.__file__).parent / "native"
    for src in ("slot.c", "clock.c", "step.c", "pool.c", "rows.c", "host.c"):
        text = (native / src).read_text()
        assert not re.search(r"#define (AICIRT_OK|ABI_|HOST_VOCAB)", text), src
