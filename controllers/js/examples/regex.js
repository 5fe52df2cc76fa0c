// regex in JavaScript: the shipped C `regex` controller's behaviour (controllers/regex/main.c).
// The argument is the pattern (a whole-string match, the SDK's syntax). aici.Follower runs the
// native aici.Regex over the generated tokens (backtracking, stopping, masks cached per DFA
// state) in one native call a step, so a step costs what C's does plus one JS call.
// regex_by_hand.js writes the same loop out in JS.
let follow;

function midProcess(arg) {
  if (arg.callIndex === 0) follow = new aici.Follower(new aici.Regex(aici.arg()));
  return follow.step();
}
