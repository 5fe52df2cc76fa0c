// regex in JavaScript, by hand: the shipped C `regex` controller's behaviour (controllers/regex/main.c)
// written out in JS over the native aici.Regex (states, backtracking, stopping). regex.js does the
// same with aici.Follower, which runs that loop natively (no per-token JS): prefer it.
let re, promptLen, states, seen = [], nSeen = 0;

function midProcess(arg) {
  seen.length = Math.max(0, seen.length - arg.backtrack);
  for (const t of arg.tokens) seen.push(t);
  if (arg.callIndex === 0) {
    re = new aici.Regex(aici.arg());
    promptLen = seen.length;
    states = [re.start()];
  }
  if (seen.length < promptLen) {
    aici.log("regex: backtracked into the prompt");
    return aici.stop();
  }
  if (arg.sampled === aici.eosToken()) return aici.stop();      // EOS chosen while accepting
  const gen = seen.length - promptLen;
  let k = Math.min(Math.max(0, nSeen - arg.backtrack), gen);
  for (; k < gen; k++) states[k + 1] = re.advance(states[k], seen[promptLen + k]);
  nSeen = gen;
  const s = states[gen];
  if (!s) {
    aici.log("regex: the text no longer matches");
    return aici.stop();
  }
  const accepting = re.accepting(s);
  if (accepting && !re.canContinue(s)) return aici.stop();        // complete match
  const m = re.mask(s);                                           // EOS included when accepting
  if (!accepting && m.isEmpty()) {
    aici.log("regex: no token can continue the match");
    return aici.stop();
  }
  return aici.sample(m);
}
