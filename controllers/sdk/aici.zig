//! aici.zig - the C SDK (aici.h) for Zig controllers: extern declarations of the same functions,
//! plus slice-friendly helpers. A Zig controller exports `aici_step` and imports this module:
//!
//!     const aici = @import("aici");
//!     export fn aici_step(arg: *const aici.Arg, res: *aici.Result) void { ... }
//!
//! Optional per-tokenizer init (aici.h's AICI_EXPORT_INIT; rules in docs/snapshots.md): run once
//! per (controller, tokenizer) at load, every request starts from a snapshot of what it built:
//!
//!     export fn aicirt_init() void { _ = aici.aici_trie(); }
//!
//! Optional per-argument prepare (aici.h's AICI_EXPORT_PREPARE; docs/snapshots.md#prepared-templates):
//! `export fn aicirt_prepare() void { ... }` compiles the argument once per (argument, capabilities)
//! in a Runtime; mid-process must still work where a host never called it.
//!
//! (Zig 0.15+ has no @cImport, hence hand-written declarations; keep them in step with aici.h.)
pub const Token = u32;

pub const Arg = extern struct {
    backtrack: u32,
    tokens: [*]const Token,
    n_tokens: u32,
    has_sampled: bool,
    sampled: Token,
    fork_group: [*]const u32,
    n_fork_group: u32,
    all_tokens: [*]const Token,
    n_all_tokens: u32,
    call_index: u32,

    pub fn newTokens(self: *const Arg) []const Token {
        return self.tokens[0..self.n_tokens];
    }
    pub fn allTokens(self: *const Arg) []const Token {
        return self.all_tokens[0..self.n_all_tokens];
    }
    pub fn forkGroup(self: *const Arg) []const u32 {
        return self.fork_group[0..self.n_fork_group];
    }
};

pub const Result = opaque {};
pub const Branch = opaque {};
pub const TokSet = extern struct { words: [*]u32, n_words: u32, vocab: u32 };
pub const Regex = opaque {};
pub const Trie = extern struct {
    nodes: [*]const [2]u32,
    n_nodes: u32,
    vocab: u32,
    max_depth: u32,
    scratch_token: Token,
};

pub const CAP_FORK: u32 = 1;
pub const CAP_BACKTRACK: u32 = 2;
pub const CAP_FF_TOKENS: u32 = 4;
pub const CAP_CONDITIONAL_FF: u32 = 8;

pub extern fn aici_malloc(n: usize) ?*anyopaque;
pub extern fn aici_free(p: ?*const anyopaque) void;
pub extern fn aici_tmp_alloc(n: usize) ?*anyopaque;
pub extern fn aici_calloc(n: usize, size: usize) ?*anyopaque;
pub extern fn aici_realloc(p: ?*anyopaque, n: usize) ?*anyopaque;

pub extern fn aici_branch(res: *Result) ?*Branch;
pub extern fn aici_branch_mask(b: ?*Branch, mask: *const TokSet) void;
pub extern fn aici_branch_temperature(b: ?*Branch, t: f32) void;
pub extern fn aici_branch_splice(b: ?*Branch, when: ?[*]const Token, n_when: u32, backtrack: u32, ff: ?[*]const Token, n_ff: u32) void;
pub extern fn aici_sample(res: *Result, mask: *const TokSet) ?*Branch;
pub extern fn aici_ff(res: *Result, backtrack: u32, ff: ?[*]const Token, n_ff: u32) ?*Branch;
pub extern fn aici_noop(res: *Result) ?*Branch;

pub extern fn aici_vocab_size() u32;
pub extern fn aici_eos_token() Token;
pub extern fn aici_self_seq_id() u32;
pub extern fn aici_capabilities() u32;
pub extern fn aici_tokenize(text: [*]const u8, len: usize, n_out: *u32) [*]Token;
pub extern fn aici_detokenize(toks: [*]const Token, n: u32, len_out: *u32) [*]u8;
pub extern fn aici_arg(len_out: *u32) [*]u8;
pub extern fn aici_var_get(name: [*:0]const u8, len_out: *u32) ?[*]u8;
pub extern fn aici_var_set(name: [*:0]const u8, value: [*]const u8, len: usize) void;
pub extern fn aici_var_append(name: [*:0]const u8, value: [*]const u8, len: usize) void;
pub extern fn aici_log(msg: [*]const u8, len: usize) void;
pub extern fn aici_logs(msg: [*:0]const u8) void;
pub extern fn aici_tokenize_str(text: [*:0]const u8, n_out: *u32) [*]Token;

pub extern fn aici_tokset_new() ?*TokSet;
pub extern fn aici_tokset_tmp() ?*TokSet;
pub extern fn aici_tokset_free(s: ?*TokSet) void;
pub extern fn aici_tokset_clear(s: *TokSet) void;
pub extern fn aici_tokset_fill(s: *TokSet) void;
pub extern fn aici_tokset_allow(s: *TokSet, t: Token) void;
pub extern fn aici_tokset_deny(s: *TokSet, t: Token) void;
pub extern fn aici_tokset_has(s: *const TokSet, t: Token) bool;
pub extern fn aici_tokset_allow_range(s: *TokSet, lo: Token, hi: Token) void;
pub extern fn aici_tokset_deny_range(s: *TokSet, lo: Token, hi: Token) void;
pub extern fn aici_tokset_count(s: *const TokSet) u32;
pub extern fn aici_tokset_empty(s: *const TokSet) bool;
pub extern fn aici_tokset_copy(dst: *TokSet, src: *const TokSet) void;
pub extern fn aici_tokset_and(dst: *TokSet, src: *const TokSet) void;
pub extern fn aici_tokset_or(dst: *TokSet, src: *const TokSet) void;
pub extern fn aici_tokset_sub(dst: *TokSet, src: *const TokSet) void;

pub extern fn aici_trie() ?*const Trie;
pub extern fn aici_token_bytes(t: Token, len_out: *u32) ?[*]const u8;

pub extern fn aici_regex_compile(pattern: [*]const u8, len: usize, err: ?*?[*:0]u8) ?*Regex;
pub extern fn aici_regex_start(re: *Regex) u32;
pub extern fn aici_regex_advance(re: *Regex, state: u32, bytes: [*]const u8, n: usize) u32;
pub extern fn aici_regex_accepting(re: *Regex, state: u32) bool;
pub extern fn aici_regex_can_continue(re: *Regex, state: u32) bool;
pub extern fn aici_regex_mask(re: *Regex, trie: *const Trie, state: u32, out: *TokSet) void;
pub extern fn aici_regex_mask_write(re: *Regex, trie: *const Trie, state: u32, out: *TokSet) void;
pub extern fn aici_regex_mask_cached(re: *Regex, trie: *const Trie, state: u32) ?*const TokSet;
pub extern fn aici_regex_cache_limit(re: *Regex, limit: u32) void;
pub extern fn aici_regex_use_slices(re: *Regex, on: bool) void;
pub extern fn aici_regex_slices_after(re: *Regex, masks: u32) void;

// ---- slice helpers (results are heap memory: free with `free`) ----
pub fn tokenize(text: []const u8) []Token {
    var n: u32 = 0;
    const p = aici_tokenize(text.ptr, text.len, &n);
    return p[0..n];
}
pub fn detokenize(toks: []const Token) []u8 {
    var n: u32 = 0;
    const p = aici_detokenize(toks.ptr, @intCast(toks.len), &n);
    return p[0..n];
}
pub fn arg() []u8 {
    var n: u32 = 0;
    const p = aici_arg(&n);
    return p[0..n];
}
pub fn varGet(name: [*:0]const u8) ?[]u8 {
    var n: u32 = 0;
    const p = aici_var_get(name, &n) orelse return null;
    return p[0..n];
}
pub fn varSet(name: [*:0]const u8, value: []const u8) void {
    aici_var_set(name, value.ptr, value.len);
}
pub fn log(msg: []const u8) void {
    aici_log(msg.ptr, msg.len);
}
/// End this sequence in error (C: `aici_fail`): log `msg` and a newline, then trap.
pub fn fail(msg: []const u8) noreturn {
    aici_log(msg.ptr, msg.len);
    aici_log("\n", 1);
    @trap();
}
pub fn free(p: anytype) void {
    aici_free(@ptrCast(p.ptr));
}
pub fn ff(res: *Result, backtrack: u32, toks: []const Token) void {
    _ = aici_ff(res, backtrack, toks.ptr, @intCast(toks.len));
}
