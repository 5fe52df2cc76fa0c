// choice in JavaScript: the shipped C `choice` controller's behaviour (controllers/choice/main.c).
// One branch per option (argument: options, one per line). With fork: each child produces its
// option (fast-forwarded where the host grants ff-tokens, else forced by masks), writes it to
// "choice.<i>" and stops; the parent waits until every child has written, then writes "choices"
// (one option a line) and stops. Without fork: this sequence picks one option by masks.
const MAX_OPTS = 64, MAX_WAIT = 200;
let opts = [], promptLen = 0, mine = -1, forked = false, waited = 0, seen = [];

const hasPrefix = (o, gen) => o.length >= gen.length && gen.every((t, j) => t === o[j]);
const continueOption = (o, k, ff) =>
  ff ? {splices: [{backtrack: 0, ffTokens: o.slice(k)}]} : {sampleMask: new aici.TokenSet([o[k]])};
const noop = () => ({splices: [{backtrack: 0, ffTokens: []}]});

function child(gen, ff) {
  const o = opts[mine];
  if (!hasPrefix(o, gen)) throw new Error(`choice: the tokens after the prompt are not option ${mine}'s`);
  if (gen.length < o.length) return {branches: [continueOption(o, gen.length, ff)]};
  aici.varSet(`choice.${mine}`, aici.detokenize(o));
  return aici.stop();
}

function parent() {
  const vals = opts.map((_, i) => aici.varGet(`choice.${i}`));
  if (vals.every(v => v !== undefined)) {
    aici.varSet("choices", vals.map(v => v + "\n").join(""));
    return aici.stop();
  }
  if (++waited > MAX_WAIT) {
    aici.log("choice: gave up waiting for the branches");
    return aici.stop();
  }
  return {branches: [noop()]};
}

function pick(gen, ff) {
  const m = new aici.TokenSet(), k = gen.length;
  let done = -1, only = -1, going = 0;
  opts.forEach((o, i) => {
    if (!hasPrefix(o, gen)) return;
    if (o.length === k) {
      if (done < 0) done = i;
    } else {
      m.allow(o[k]);
      only = going++ ? -1 : i;
    }
  });
  if (done >= 0) aici.varSet("choices", aici.detokenize(opts[done]) + "\n");
  if (!going) {
    if (done < 0) throw new Error("choice: the tokens after the prompt are no option's");
    return aici.stop();
  }
  if (done < 0 && only >= 0) return {branches: [continueOption(opts[only], k, ff)]};
  if (done >= 0) m.allow(aici.eosToken());
  return aici.sample(m);
}

function midProcess(arg) {
  seen.length = Math.max(0, seen.length - arg.backtrack);
  for (const t of arg.tokens) seen.push(t);
  const caps = aici.capabilities(), ff = (caps & aici.Cap.FF_TOKENS) !== 0;
  if (arg.callIndex === 0) {
    for (const line of aici.arg().split("\n")) {
      if (!line.length) continue;
      if (opts.length === MAX_OPTS) throw new Error(`choice: more than ${MAX_OPTS} options`);
      const t = aici.tokenize(line);
      if (t.length) opts.push(t);
    }
    promptLen = seen.length;
    if (!opts.length) {
      aici.varSet("choices", "");
      return aici.stop();
    }
    if (caps & aici.Cap.FORK) {
      forked = true;
      return {branches: [noop(), ...opts.map(o => continueOption(o, 0, ff))]};
    }
  }
  const gen = seen.slice(promptLen);
  if (!forked) return pick(gen, ff);
  if (arg.forkGroup.length && arg.forkGroup[0] !== aici.selfSeqId())   // a child's first call
    mine = arg.forkGroup.indexOf(aici.selfSeqId()) - 1;
  return mine >= 0 ? child(gen, ff) : parent();
}
