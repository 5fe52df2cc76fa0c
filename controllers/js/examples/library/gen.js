// gen() in the async library (docs/js.md): the argument is JSON, the options of one gen() call
// ({regex | options, stopAt, maxTokens, storeVar}); the text generated goes to storeVar.
// gen_by_hand.js is the same job written against the low-level midProcess API.
aici.start(async () => {
  await gen(JSON.parse(aici.arg()));
});
