// fork + waitVars by hand: what library/fork.js does, written against the low-level midProcess
// API: fork into one child per option (plus the parent), each child appends its option (one
// fast-forward where the host grants ff-tokens, else one masked token a step) and writes
// "choice.<i>"; the parent polls (no-op steps) until every child has written, then "choices".
const MAX_WAIT = 1000;
let opts, mine = -1, phase = 0, k = 0, waited = 0;
const noop = () => ({branches: [{splices: [{backtrack: 0, ffTokens: []}]}]});

function midProcess(arg) {
  if (arg.callIndex === 0) {
    opts = aici.arg().split("\n").filter(o => o.length);
    if (!opts.length) {
      aici.varSet("choices", "");
      return aici.stop();
    }
    if (!(aici.capabilities() & aici.Cap.FORK)) throw new Error("fork: the host grants no fork");
    return {branches: Array.from({length: opts.length + 1}, () => ({splices: [{backtrack: 0, ffTokens: []}]}))};
  }
  if (arg.forkGroup.length) mine = Math.max(0, arg.forkGroup.indexOf(aici.selfSeqId()));
  if (mine > 0) {
    const name = opts[mine - 1], t = aici.tokenize(name);
    if (phase === 0 && (aici.capabilities() & aici.Cap.FF_TOKENS)) {
      phase = 1;
      return aici.fastForward(t);
    }
    if (phase === 0 && k < t.length) return aici.sample(new aici.TokenSet([t[k++]]));
    aici.varSet(`choice.${mine - 1}`, name);
    return aici.stop();
  }
  const vals = opts.map((_, i) => aici.varGet(`choice.${i}`));
  if (vals.every(v => v !== undefined)) {
    aici.varSet("choices", vals.map(v => v + "\n").join(""));
    return aici.stop();
  }
  if (waited++ >= MAX_WAIT) throw new Error("waitVars: gave up");
  return noop();
}
