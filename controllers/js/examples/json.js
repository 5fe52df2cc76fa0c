// JSON Schema in JavaScript: masks from the `json` controller's schema compiler and matcher
// (aici.JsonSchema), run over the generated tokens by aici.Follower. The argument is the schema
// (JSON text; options as in the json controller's "x-aicirt", or a second argument to
// JsonSchema). Unlike the json controller, this samples every token (no fast-forward of forced
// text), so its masks are the json controller's with fast_forward=0.
let follow;

function midProcess(arg) {
  if (arg.callIndex === 0) follow = new aici.Follower(new aici.JsonSchema(aici.arg()));
  return follow.step();
}
