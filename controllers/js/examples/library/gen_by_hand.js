// gen() by hand: what library/gen.js does, written against the low-level midProcess API (a state
// machine over arg.tokens): the argument is JSON {regex | options, stopAt, maxTokens, storeVar}.
// Under the constraint it samples; where the host grants ff-tokens it fast-forwards tokens the
// constraint forces, and with conditional ff-tokens attaches to each allowed token (masks of at
// most 64 tokens) a splice with the tokens forced after it. Stops at a complete match, EOS, stopAt
// or maxTokens, and writes the text (without stopAt) to storeVar. A sampled EOS is taken back
// (a conditional splice) where the host grants conditional ff-tokens and backtrack.
const LOOKAHEAD_MAX = 64;
let o, c, start, st, nFollowed = 0, seen = [], ff, cff, eosBack, any, eos, limit;

function forcedAfter(s, max) {
  const out = [];
  while (out.length < max && s && !c.accepting(s)) {
    const m = c.mask(s);
    if (m.count() !== 1) break;
    const t = m.tokens()[0];
    out.push(t);
    s = c.advance(s, t);
  }
  return out;
}

function finish(cut) {
  let text = aici.detokenize(seen.slice(start));
  if (cut >= 0) text = text.slice(0, cut);
  if (o.storeVar !== undefined) aici.varSet(o.storeVar, text);
  return aici.stop();
}

function midProcess(arg) {
  if (arg.backtrack) seen.length = Math.max(0, seen.length - arg.backtrack);
  for (const t of arg.tokens) seen.push(t);
  if (arg.callIndex === 0) {
    o = JSON.parse(aici.arg());
    c = o.options ? aici.choice(o.options) : o.regex !== undefined ? new aici.Regex(o.regex) : null;
    start = seen.length;
    st = c ? c.start() : 0;
    const caps = aici.capabilities();
    ff = (caps & aici.Cap.FF_TOKENS) !== 0;
    cff = ff && (caps & aici.Cap.CONDITIONAL_FF_TOKENS) !== 0;
    eosBack = (caps & (aici.Cap.CONDITIONAL_FF_TOKENS | aici.Cap.BACKTRACK)) === (aici.Cap.CONDITIONAL_FF_TOKENS | aici.Cap.BACKTRACK);
    any = c ? null : new aici.TokenSet().fill();
    eos = aici.eosToken();
    limit = o.maxTokens === undefined ? Infinity : o.maxTokens;
  }
  const n = seen.length - start;
  if (c) {
    if (nFollowed > n) { st = c.advance(c.start(), seen.slice(start)); nFollowed = n; }
    else if (nFollowed < n) { st = c.advance(st, seen.slice(start + nFollowed)); nFollowed = n; }
  }
  if (arg.callIndex > 0 && arg.sampled === eos) return finish(-1);   // taken back by the splice below
  if (o.stopAt !== undefined) {
    const at = aici.detokenize(seen.slice(start)).indexOf(o.stopAt);
    if (at >= 0) return finish(at);
  }
  if (n >= limit) return finish(-1);
  let mask = any;
  const splices = [];
  if (c) {
    if (!st) { aici.log("gen: the text no longer matches the constraint"); return finish(-1); }
    const accepting = c.accepting(st);
    if (accepting && !c.canContinue(st)) return finish(-1);
    mask = c.mask(st);
    if (mask.isEmpty()) { aici.log("gen: no token can continue the match"); return finish(-1); }
    if (ff && !accepting) {
      const forced = forcedAfter(st, limit - n);
      if (forced.length) return aici.fastForward(forced);
    }
    if (cff && mask.count() <= LOOKAHEAD_MAX) {
      for (const t of mask.tokens()) {
        if (t === eos) continue;
        const after = forcedAfter(c.advance(st, t), limit - n - 1);
        if (after.length) splices.push({whenSampled: [t], backtrack: 0, ffTokens: after});
      }
    }
  }
  if (eosBack && mask.has(eos)) splices.push({whenSampled: [eos], backtrack: 1, ffTokens: []});
  const branch = {sampleMask: mask};
  if (splices.length) branch.splices = splices;
  return {branches: [branch]};
}
