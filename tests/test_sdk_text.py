"""The SDK's helpers that controllers used to copy (controllers/sdk/: aici_buf.c, aici_utf8.c,
aici_cps_regex.c, aici_history.c), each against a Python oracle through a small controller:

- a code-point set as regex text: the compiled regex accepts exactly the set's characters
  (surrogates and values past U+10FFFF never), checked as a mask over one token per character;
- hex escapes: the value, where the digits end, and each error, as Python reads them;
- decimal repeat counts: the value (saturating), where the digits end, whether there were any;
- token healing: the last token joins the forced text only when whole UTF-8, and each token of
  the result is checked against the text (a normalizing tokenizer's tokens are refused);
- UTF-8 encode/decode: the same bytes and code points as Python's codec;
- token history: after any sequence of appends and backtracks, the state is the one the tokens
  now in the sequence give, and a token the step refuses ends the history before it.
"""
from __future__ import annotations

import random
import struct

import pytest

from _sdk_host import MiniHost
try:
    from aicirt.build.toolchain import build_cached
except ImportError:   # before runtime/ was grouped into packages (the lead merges this across it)
    from aicirt.build.toolchain import build_cached

SOURCE = r"""
#include "aici.h"

static char mode;
static aici_history_t hist;

/* history: the state is the sum of the tokens; token 255 leaves the constraint */
static bool add(void *ctx, void *state, aici_token_t t) {
  (void)ctx;
  if (t == 255) return false;
  *(uint32_t *)state += t;
  return true;
}

static void cps_case(const uint8_t *a, uint32_t n, aici_result_t *res) {
  aici_cp_set_t s = {0};
  for (uint32_t i = 1; i + 8 <= n; i += 8) {
    uint32_t lo, hi;
    __builtin_memcpy(&lo, a + i, 4);
    __builtin_memcpy(&hi, a + i + 4, 4);
    aici_cps_add(&s, lo, hi);
  }
  aici_buf_t b = {0};
  bool nonempty = aici_cps_regex(&b, &s);
  char *err = 0;
  aici_regex_t *re = aici_regex_compile(b.p, b.n, &err);
  if (!re) aici_fail("regex: %s in %s", err, b.p);
  aici_logf("%d %u\n", (int)nonempty, b.n);
  aici_tokset_t *m = aici_tokset_tmp();
  aici_regex_mask(re, aici_trie(), aici_regex_start(re), m);
  aici_sample(res, m);
}

static void escape_case(const uint8_t *a, uint32_t n) {   /* a[1]: digits, a[2..]: text */
  uint32_t i = 2;
  int64_t v = aici_escape_hex(a, n, &i, a[1]);
  aici_logf("%d %u %s\n", (int)v, i - 2, v < 0 ? aici_escape_error(v) : "");
}

static void escape_char_case(const uint8_t *a, uint32_t n) {   /* each byte after a backslash */
  for (uint32_t i = 1; i < n; i++) aici_logf("%d ", aici_escape_char(a[i]));
}

static void uint_case(const uint8_t *a, uint32_t n) {   /* decimal digits from a[1], cap 1000 */
  uint32_t i = 1, v = 7;
  bool any = aici_read_uint(a, n, &i, 1000, &v);
  aici_logf("%d %u %u\n", (int)any, v, i - 1);
}

static void heal_case(const uint8_t *a, uint32_t n) {   /* a[1..5): last token (~0: none), then forced */
  aici_token_t last;
  __builtin_memcpy(&last, a + 1, 4);
  aici_heal_t h;
  bool ok = aici_heal_tokenize(&h, last == ~0u ? 0 : &last, a + 5, n - 5);
  aici_logf("%d %d %u %u:", (int)ok, (int)h.joined, h.plen, h.len);
  uint32_t pos = 0;
  for (uint32_t i = 0; ok && i < h.nt; i++) {
    const uint8_t *b;
    uint32_t len;
    bool at = aici_heal_token_at(&h, h.toks[i], &pos, &b, &len);
    aici_logf(" %u/%d/%u", h.toks[i], (int)at, pos);
  }
  aici_free(h.toks);
}

static void utf8_case(const uint8_t *a, uint32_t n) {     /* u32 code points: encode, decode */
  for (uint32_t i = 1; i + 4 <= n; i += 4) {
    uint32_t c, d;
    uint8_t o[4];
    __builtin_memcpy(&c, a + i, 4);
    uint32_t k = aici_utf8_encode(c, o);
    uint32_t used = aici_utf8_decode(o, k, &d);
    aici_logf("%u %x %x %x %x %u %u\n", k, o[0], k > 1 ? o[1] : 0, k > 2 ? o[2] : 0, k > 3 ? o[3] : 0, used, d);
  }
}

void aici_step(const aici_arg_t *arg, aici_result_t *res) {
  if (arg->call_index == 0) {
    uint32_t n;
    uint8_t *a = aici_arg(&n);
    mode = (char)a[0];
    if (mode == 'c') { cps_case(a, n, res); return; }
    if (mode == 'e') { escape_case(a, n); return; }
    if (mode == 'u') { utf8_case(a, n); return; }
    if (mode == 'x') { escape_char_case(a, n); return; }
    if (mode == 'd') { uint_case(a, n); return; }
    if (mode == 'k') { heal_case(a, n); return; }
    uint32_t zero = 0;
    aici_history_init(&hist, arg, 4, &zero);
  }
  if (mode != 'h') return;
  if (!aici_history_update(&hist, arg, add, 0)) return;     /* refused, or into the prompt: stop */
  uint32_t sum = *(uint32_t *)aici_history_state(&hist);
  aici_tokset_t *m = aici_tokset_tmp();
  aici_tokset_allow(m, sum % 200);                          /* the state, as the mask */
  aici_tokset_allow(m, 200 + hist.n_seen % 50);             /* the history's length */
  aici_sample(res, m);
}
"""

BYTE_VOCAB = [bytes([i]) for i in range(256)] + [b""]


@pytest.fixture(scope="module")
def wasm(tmp_path_factory):
    d = tmp_path_factory.mktemp("sdk_text")
    (d / "main.c").write_text(SOURCE)
    return build_cached(str(d)).read_bytes()


# ---- code-point sets as regex text -----------------------------------------------------------
def _probes(ranges, rng) -> list[int]:
    """Every range's ends and their neighbours, each encoded length's and continuation byte's
    boundaries, the surrogates' edges, and random code points."""
    ps = {0, 0x7F, 0x80, 0x7FF, 0x800, 0xFFFF, 0x10000, 0x10FFFF, 0xD7FF, 0xE000, 0x3F, 0x40, 0xBF, 0xC0,
          0xFFF, 0x1000, 0x3FFFF, 0x40000}
    for lo, hi in ranges:
        ps |= {lo - 1, lo, lo + 1, hi - 1, hi, hi + 1, (lo + hi) // 2}
    ps |= {rng.randrange(0, 0x110000) for _ in range(60)}
    return sorted(p for p in ps if 0 <= p <= 0x10FFFF and not 0xD800 <= p <= 0xDFFF)


CPS_CASES = [
    [(ord("a"), ord("z"))],
    [(0, 0x10FFFF)],
    [(0x80, 0x7FF)],
    [(0x7F, 0x80), (0x7FF, 0x800), (0xFFFF, 0x10000)],
    [(0xD000, 0xE100)],                      # spans the surrogates: they are dropped
    [(0x10FFF0, 0x11FFFF)],                  # past U+10FFFF: clipped
    [(0x4E00, 0x9FFF), (0x30, 0x39), (0x3040, 0x309F)],
    [(0x100, 0x100), (0x1F600, 0x1F64F), (0x0, 0x1F)],
    [(5, 3)],                                # lo > hi: nothing, the empty set
]


@pytest.mark.parametrize("ranges", CPS_CASES, ids=lambda r: ",".join(f"{a:x}-{b:x}" for a, b in r))
def test_code_point_set_regex_matches_exactly_its_characters(wasm, ranges):
    rng = random.Random(hash(tuple(ranges)) & 0xFFFF)
    probes = _probes(ranges, rng)
    member = lambda c: any(lo <= c <= hi for lo, hi in ranges)
    bad = [b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xf4\x90\x80\x80", b"\x80", b"\xc0\x80"]   # never one character
    vocab = [chr(c).encode() for c in probes] + bad + [b""]
    arg = b"c" + b"".join(struct.pack("<II", lo, hi) for lo, hi in ranges)
    host = MiniHost(wasm, vocab, len(vocab) - 1, lambda s: [], arg=arg)
    br = host.step([1])
    nonempty, _ = host.logs[0].split()
    want = {i for i, c in enumerate(probes) if member(c)}
    scalars = any(lo <= hi and lo <= 0x10FFFF and not 0xD800 <= lo <= hi <= 0xDFFF for lo, hi in ranges)
    assert nonempty == ("1" if scalars else "0")
    got = br[0].allowed() if br else set()
    assert got == want, sorted(hex(probes[i]) for i in got ^ want if i < len(probes))


# ---- hex escapes -------------------------------------------------------------------------------
ESCAPES = [
    (2, b"41rest", 0x41, 2), (4, b"00e9", 0xE9, 4), (8, b"0001F600", 0x1F600, 8),
    (0, b"{1F600}x", 0x1F600, 7), (0, b"{0}", 0, 3), (4, b"ABCDEF", 0xABCD, 4),
    (2, b"4", "bad hex escape", 0), (2, b"4g", "bad hex escape", 0), (0, b"{}", "bad hex escape", 0),
    (0, b"{123456789}", "bad hex escape", 0), (0, b"{12", "bad hex escape", 0), (0, b"12", "bad hex escape", 0),
    (4, b"d800", "surrogate escape", 0), (4, b"DFFF", "surrogate escape", 0),
    (8, b"00110000", "escape out of range", 0), (0, b"{FFFFFFFF}", "escape out of range", 0),
]


@pytest.mark.parametrize("digits,text,want,used", ESCAPES, ids=lambda x: repr(x))
def test_hex_escapes(wasm, digits, text, want, used):
    host = MiniHost(wasm, BYTE_VOCAB, 256, lambda s: [], arg=b"e" + bytes([digits]) + text)
    host.step([1])
    v, n, *msg = host.logs[0].split(" ", 2)
    if isinstance(want, int):
        assert (int(v), int(n)) == (want, used)
    else:
        assert int(v) < 0 and int(n) == 0 and msg[0].startswith(want), host.logs


def test_single_character_escapes(wasm):
    chars = bytes(range(32, 127))
    host = MiniHost(wasm, BYTE_VOCAB, 256, lambda s: [], arg=b"x" + chars)
    host.step([1])
    got = [int(v) for v in "".join(host.logs).split()]
    want = {ord("n"): 10, ord("t"): 9, ord("r"): 13, ord("f"): 12, ord("v"): 11, ord("0"): 0}
    assert got == [want.get(c, -1) for c in chars]


@pytest.mark.parametrize("text,want", [
    (b"", (0, 0, 0)), (b"}", (0, 0, 0)), (b"a12", (0, 0, 0)), (b"12}", (1, 12, 2)), (b"007,", (1, 7, 3)),
    (b"1000", (1, 1000, 4)), (b"1001", (1, 1000, 4)),
    (b"99999999999999999999x", (1, 1000, 20)),   # saturates, and still reads every digit
])
def test_decimal_counts(wasm, text, want):
    host = MiniHost(wasm, BYTE_VOCAB, 256, lambda s: [], arg=b"d" + text)
    host.step([1])
    assert tuple(int(x) for x in host.logs[0].split()) == want, host.logs


# ---- token healing -------------------------------------------------------------------------------
HEAL_VOCAB = [bytes([i]) for i in range(256)] + [b"", b"ab", b"abc", "é".encode()]


def _greedy(text: bytes) -> list[int]:
    out, i = [], 0
    while i < len(text):
        t = max((k for k, b in enumerate(HEAL_VOCAB) if b and text.startswith(b, i)), key=lambda k: len(HEAL_VOCAB[k]))
        out.append(t)
        i += len(HEAL_VOCAB[t])
    return out


@pytest.mark.parametrize("last,forced,lower", [
    (ord("a"), b"bc", False),        # joined: "abc" is one token, replacing the last one
    (None, b"abcab", False),         # nothing to join
    (0xC3, b"\xa9ab", False),        # the last token is a cut character: not joined
    (ord("x"), b"\xc3\xa9ab", False),
    (ord("a"), b"BC", True),         # a normalizing tokenizer: its tokens do not spell the text
])
def test_token_healing_joins_whole_characters_and_checks_each_token(wasm, last, forced, lower):
    def encode(s: str) -> list[int]:
        return _greedy((s.lower() if lower else s).encode())
    host = MiniHost(wasm, HEAL_VOCAB, 256, encode,
                    arg=b"k" + struct.pack("<I", 0xFFFFFFFF if last is None else last) + forced)
    host.step([1])
    head, tail = "".join(host.logs).split(":")
    ok, joined, plen, length = (int(x) for x in head.split())
    prefix = HEAL_VOCAB[last] if last is not None and last < 0x80 else b""   # whole UTF-8 only
    text = prefix + forced
    assert (ok, joined, plen, length) == (1, int(bool(prefix)), len(prefix), len(text)), host.logs
    want, pos = [], 0
    for t in encode(text.decode("utf-8", "replace")):
        b = HEAL_VOCAB[t]
        want.append(f"{t}/{int(text[pos:pos + len(b)] == b)}/{pos + len(b)}")
        pos += len(b)
    assert tail.split() == want
    if lower:
        assert any(w.split("/")[1] == "0" for w in want)   # the check does refuse a token


# ---- UTF-8 ---------------------------------------------------------------------------------------
def test_utf8_encode_decode_agree_with_python(wasm):
    rng = random.Random(7)
    cps = [0, 0x7F, 0x80, 0x7FF, 0x800, 0xD7FF, 0xE000, 0xFFFF, 0x10000, 0x10FFFF]
    cps += [rng.randrange(0, 0x110000) for _ in range(200)]
    cps = [c for c in cps if not 0xD800 <= c <= 0xDFFF]
    host = MiniHost(wasm, BYTE_VOCAB, 256, lambda s: [], arg=b"u" + struct.pack(f"<{len(cps)}I", *cps))
    host.step([1])
    lines = "".join(host.logs).split("\n")[:-1]
    assert len(lines) == len(cps)
    for c, line in zip(cps, lines):
        k, b0, b1, b2, b3, used, back = line.split()
        enc = chr(c).encode()
        assert bytes(int(x, 16) for x in (b0, b1, b2, b3)[: int(k)]) == enc
        assert (int(used), int(back)) == (len(enc), c)


# ---- token history -------------------------------------------------------------------------------
def _expect(tokens: list[int]) -> set[int]:
    return {sum(tokens) % 200, 200 + len(tokens) % 50}


def test_history_follows_appends_and_backtracks(wasm):
    rng = random.Random(31)
    host = MiniHost(wasm, BYTE_VOCAB, 256, lambda s: [], arg=b"h")
    assert host.step([7, 8, 9])[0].allowed() == _expect([])    # the prompt is not fed
    seq: list[int] = []
    for _ in range(300):                                         # past the initial 64 states: it grows
        back = rng.choice([0, 0, 0, 1, 2, 5]) if seq else 0
        back = min(back, len(seq))
        add = [rng.randrange(0, 255) for _ in range(rng.choice([0, 1, 1, 3]))]
        if not back and not add:
            add = [1]
        seq = seq[: len(seq) - back] + add
        br = host.step(add, backtrack=back, sampled=add[-1] if add else None)
        assert br and br[0].allowed() == _expect(seq), (len(seq), back, add)


def test_history_stops_at_a_refused_token_and_resumes_after_backtracking_over_it(wasm):
    host = MiniHost(wasm, BYTE_VOCAB, 256, lambda s: [], arg=b"h")
    host.step([1])
    assert host.step([10, 20])[0].allowed() == _expect([10, 20])
    assert host.step([30, 255, 40]) == []                        # 255 refused: no branch
    # the host takes back 255 and 40; the state is that of [10, 20, 30]
    assert host.step([5], backtrack=2)[0].allowed() == _expect([10, 20, 30, 5])


def test_history_backtracked_into_the_prompt_stops(wasm):
    host = MiniHost(wasm, BYTE_VOCAB, 256, lambda s: [], arg=b"h")
    host.step([1, 2])
    host.step([3])
    assert host.step([], backtrack=3) == []
