// fork + waitVars in the async library: the argument is options, one a line. The sequence forks
// into one child per option; child i appends its option and writes it to "choice.<i>"; the parent
// waits for every child's variable, then writes them all to "choices" (one a line).
// fork_by_hand.js is the same job against the low-level midProcess API.
aici.start(async () => {
  const opts = aici.arg().split("\n").filter(o => o.length);
  const i = await fork(opts.length + 1);
  if (i > 0) {
    await $`${opts[i - 1]}`;
    setVar(`choice.${i - 1}`, opts[i - 1]);
    return;
  }
  const vals = await waitVars(...opts.map((_, k) => `choice.${k}`));
  setVar("choices", vals.map(v => v + "\n").join(""));
});
