// yesno in JavaScript: the shipped C `yesno` controller's behaviour (controllers/yesno/main.c).
// Sample one of two answers ("Yes"/"No" unless the argument gives "A\nB"), then stop; the rest
// of a multi-token answer is fast-forwarded by a conditional splice where the host grants
// conditional ff-tokens, else by a splice the next step where it grants ff-tokens, else forced
// one token a step by masks. The answer goes to variable "answer".
let opts, promptLen;
let seen = [];                       // the tokens as this controller has seen them

function midProcess(arg) {
  seen.length = Math.max(0, seen.length - arg.backtrack);
  for (const t of arg.tokens) seen.push(t);
  if (arg.callIndex === 0) {
    const a = aici.arg(), nl = a.indexOf("\n");
    opts = (nl >= 0 ? [a.slice(0, nl), a.slice(nl + 1)] : ["Yes", "No"]).map(aici.tokenize);
    if (!opts[0].length || !opts[1].length || opts[0][0] === opts[1][0])
      throw new Error("yesno: the two answers need distinct first tokens");
    promptLen = seen.length;
  }
  const caps = aici.capabilities(), gen = seen.slice(promptLen), k = gen.length;
  if (k === 0) {                     // first call, or the host took the answer back
    const splices = [];
    if ((caps & aici.Cap.CONDITIONAL_FF_TOKENS) && (caps & aici.Cap.FF_TOKENS))
      for (const o of opts)
        if (o.length > 1) splices.push({whenSampled: [o[0]], backtrack: 0, ffTokens: o.slice(1)});
    return {branches: [{sampleMask: new aici.TokenSet([opts[0][0], opts[1][0]]), splices}]};
  }
  const i = gen[0] === opts[0][0] ? 0 : 1, o = opts[i];
  if (k > o.length || gen.some((t, j) => t !== o[j]))
    throw new Error("yesno: the tokens after the prompt are no answer's");
  if (k === o.length) {
    aici.varSet("answer", i === 0 ? "yes" : "no");
    return aici.stop();
  }
  if (caps & aici.Cap.FF_TOKENS) return aici.fastForward(o.slice(k));
  return aici.sample(new aici.TokenSet([o[k]]));
}
