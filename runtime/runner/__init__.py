"""Running a controller on an engine, as `aicirt run`, the server's commands, programs and the
fuzzer do: `run` (resolve a controller by path, tag or name, drive it on an engine, stream what
it writes) and `arg_check` (the model's own tokenizer, and a controller's first call judged on it
before a request is accepted). Above the engine; below programs, the server and the CLI."""
