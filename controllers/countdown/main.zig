//! countdown (Zig): " N", " N-1", ... " 1", " liftoff!", then stops. The argument is N (default
//! 3; anything else but a number is an error). Each piece is fast-forwarded in one splice where
//! the host grants ff-tokens, else forced one token a step by single-token masks. Each call
//! reads how far it is from the tokens it sees, so a host that takes tokens back only makes it
//! repeat them. Uses the C SDK through the `aici` Zig module.
const std = @import("std");
const aici = @import("aici");

var next: i32 = -1; // the number of the next piece to plan; 0 = liftoff; -1 = all planned
var prompt_len: u32 = 0;
// The pieces planned so far, one after the other, and where each ends.
var planned: []aici.Token = &.{};
var n_planned: usize = 0;
var ends: []usize = &.{};
var n_pieces: usize = 0;

fn grow(comptime T: type, buf: []T, want: usize) []T {
    if (want <= buf.len) return buf;
    const cap = @max(want, 2 * buf.len, 16);
    const p = aici.aici_realloc(if (buf.len == 0) null else @ptrCast(buf.ptr), cap * @sizeOf(T)) orelse
        aici.fail("countdown: out of memory");
    return @as([*]T, @ptrCast(@alignCast(p)))[0..cap];
}

fn planPiece() void {
    var buf: [32]u8 = undefined;
    const text = if (next == 0) " liftoff!" else std.fmt.bufPrint(&buf, " {d}", .{next}) catch unreachable;
    const toks = aici.tokenize(text);
    defer aici.free(toks);
    planned = grow(aici.Token, planned, n_planned + toks.len);
    @memcpy(planned[n_planned .. n_planned + toks.len], toks);
    n_planned += toks.len;
    ends = grow(usize, ends, n_pieces + 1);
    ends[n_pieces] = n_planned;
    n_pieces += 1;
    next -= 1;
}

export fn aici_step(arg: *const aici.Arg, res: *aici.Result) void {
    if (arg.call_index == 0) {
        const a = aici.arg();
        defer aici.free(a);
        const n = std.mem.trim(u8, a, " \n");
        next = if (n.len == 0) 3 else std.fmt.parseInt(i32, n, 10) catch aici.fail("countdown: the argument must be a number");
        prompt_len = arg.n_all_tokens;
    }
    const gen = arg.allTokens()[prompt_len..];
    while (gen.len >= n_planned and next >= 0) planPiece();
    if (gen.len > n_planned or !std.mem.eql(aici.Token, gen, planned[0..gen.len]))
        aici.fail("countdown: the tokens after the prompt are not the countdown");
    if (gen.len == n_planned) return; // all said: no branch, stop
    var piece: usize = n_pieces - 1; // the piece `gen` ends inside (pieces end in order)
    while (piece > 0 and ends[piece - 1] > gen.len) piece -= 1;
    if (aici.aici_capabilities() & aici.CAP_FF_TOKENS != 0) {
        aici.ff(res, 0, planned[gen.len..ends[piece]]);
    } else {
        const m = aici.aici_tokset_tmp() orelse aici.fail("countdown: out of memory");
        aici.aici_tokset_allow(m, planned[gen.len]);
        _ = aici.aici_sample(res, m);
    }
}
