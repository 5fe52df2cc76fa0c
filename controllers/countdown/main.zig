//! countdown (Zig): fast-forwards " N", " N-1", ... " 1", " liftoff!" one step at a time, then
//! stops. The argument is N (default 3; anything else but a number is an error). Uses the C SDK through the `aici` Zig module.
const std = @import("std");
const aici = @import("aici");

var next: i32 = -1; // the number to emit next; 0 = liftoff; -1 = done

export fn aici_step(arg: *const aici.Arg, res: *aici.Result) void {
    if (arg.call_index == 0) {
        const a = aici.arg();
        defer aici.free(a);
        const n = std.mem.trim(u8, a, " \n");
        next = if (n.len == 0) 3 else std.fmt.parseInt(i32, n, 10) catch aici.fail("countdown: the argument must be a number");
    }
    if (next < 0) return; // no branch: stop
    var buf: [32]u8 = undefined;
    const text = if (next == 0) " liftoff!" else std.fmt.bufPrint(&buf, " {d}", .{next}) catch unreachable;
    const toks = aici.tokenize(text);
    defer aici.free(toks);
    aici.ff(res, 0, toks);
    next -= 1;
}
