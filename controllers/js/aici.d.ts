// TypeScript declarations for scripts run by the js controller (controllers/js, docs/js.md).
// The API mirrors wit/aici.wit: a script defines `midProcess(arg)` and returns a result shaped
// like the WIT's `mid-process-result`. Token ids are numbers; variables are strings (UTF-8).
// Anything invalid (a wrong type, a token id >= vocabSize(), a misshapen result) throws, and an
// uncaught exception ends the sequence with its message and stack in the sequence's error.

/** WIT `mid-process-arg`, plus `callIndex`. */
interface MidProcessArg {
  /** Tokens removed from the end since the previous call. */
  backtrack: number;
  /** Tokens appended since the previous call (on the first call: the whole prompt). */
  tokens: number[];
  /** The token sampled in the previous step, before any splice; undefined if none was. */
  sampled?: number;
  /** Non-empty only on the first call after a fork: all sequences of the fork, parent first. */
  forkGroup: number[];
  /** 0 on the first call; a fork's children continue the parent's count. */
  callIndex: number;
}

/** WIT `splice`: applied when the sampled token is in `whenSampled` (empty or absent: always). */
interface Splice {
  whenSampled?: number[];
  /** Tokens to remove from the end first; counts the sampled token when there was one. Default 0. */
  backtrack?: number;
  /** Tokens to append after backtracking. Default []. */
  ffTokens?: number[];
}

/** WIT `branch`. Without `sampleMask`, `splices` must hold exactly one unconditional splice. */
interface Branch {
  sampleMask?: aici.TokenSet | null;
  /** This step's temperature; absent or null: the request's. */
  temperature?: number | null;
  /** First matching splice wins; none matching: keep the sampled token. */
  splices?: Splice[];
}

/** WIT `mid-process-result`: no branches = stop, one = continue, several = fork. */
interface MidProcessResult {
  branches: Branch[];
}

/** Defined by the script (a global function declaration). */
declare function midProcess(arg: MidProcessArg): MidProcessResult;

declare namespace aici {
  /** WIT `capability-set` bits, as `capabilities()` returns them. */
  const Cap: { readonly FORK: 1; readonly BACKTRACK: 2; readonly FF_TOKENS: 4; readonly CONDITIONAL_FF_TOKENS: 8 };

  /** A set of token ids over the vocabulary, a native bitset (the SDK's). Mutators return `this`. */
  class TokenSet {
    /** Empty, or holding `tokens`. Throws RangeError for an id >= vocabSize(). */
    constructor(tokens?: ArrayLike<number>);
    allow(token: number): this;
    deny(token: number): this;
    has(token: number): boolean;
    /** [lo, hi) */
    allowRange(lo: number, hi: number): this;
    denyRange(lo: number, hi: number): this;
    clear(): this;
    /** Allow every token. */
    fill(): this;
    and(other: TokenSet): this;
    or(other: TokenSet): this;
    /** this &= ~other */
    sub(other: TokenSet): this;
    /** this = other */
    set(other: TokenSet): this;
    copy(): TokenSet;
    count(): number;
    isEmpty(): boolean;
    /** The vocabulary size. */
    size(): number;
    /** The allowed ids, ascending. */
    tokens(): number[];
  }

  /** The SDK's regex (a whole-string match; syntax: docs/writing-controllers.md), as a DFA whose
   *  states are numbers: 0 is dead. Masks are computed natively and cached per state. */
  class Regex {
    /** Throws SyntaxError naming the offset of a bad pattern. */
    constructor(pattern: string);
    start(): number;
    /** The state after the bytes of a token (or of each token, in order); 0 once dead.
     *  A token without bytes (a special token) leaves the state unchanged. */
    advance(state: number, tokens: number | number[]): number;
    accepting(state: number): boolean;
    /** Some byte keeps the match going. */
    canContinue(state: number): boolean;
    /** The tokens that keep the text a prefix of a match, plus EOS where `state` accepts.
     *  Read-only (cached): copy() it to change it. */
    mask(state: number): TokenSet;
  }

  function vocabSize(): number;
  function eosToken(): number;
  function selfSeqId(): number;
  function capabilities(): number;
  function tokenize(text: string): number[];
  /** The tokens' bytes as a string (invalid UTF-8 becomes U+FFFD). */
  function detokenize(tokens: number[]): string;
  /** One token's bytes; null for a token without bytes (a special token). */
  function tokenBytes(token: number): Uint8Array | null;
  /** The script's own argument: what follows the script's NUL in the controller argument, or the
   *  whole argument for a script bound into its module (`aicirt upload ctrl.js`). */
  function arg(): string;
  /** The sequence as this controller sees it, prompt included (during midProcess only). */
  function allTokens(): number[];
  /** Variables shared by every sequence of the request (all forks), streamed to the client. */
  function varGet(name: string): string | undefined;
  function varSet(name: string, value: string): void;
  function varAppend(name: string, value: string): void;
  /** One log line: the values as strings, joined by spaces (each cut at 16 KiB). console.log too. */
  function log(...values: unknown[]): void;

  /** {branches: []} */
  function stop(): MidProcessResult;
  /** One branch sampling under `mask` (options: temperature, splices). */
  function sample(mask: TokenSet, options?: Omit<Branch, "sampleMask">): MidProcessResult;
  /** One branch without sampling: backtrack, then append `tokens`. */
  function fastForward(tokens: number[], backtrack?: number): MidProcessResult;
  /** Wait this step: fastForward([], 0). */
  function noop(): MidProcessResult;
}

declare const console: { log(...v: unknown[]): void; info(...v: unknown[]): void; warn(...v: unknown[]): void;
                         error(...v: unknown[]): void; debug(...v: unknown[]): void };
