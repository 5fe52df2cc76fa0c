// TypeScript declarations for scripts run by the js controller (controllers/js, docs/js.md).
// The API mirrors wit/aici.wit: a script defines `midProcess(arg)` and returns a result shaped
// like the WIT's `mid-process-result`. Token ids are numbers; variables are strings (UTF-8).
// Anything invalid throws, and an uncaught exception ends the sequence with its message and stack
// in the sequence's error. Nothing is coerced: a token id is a number that is an integer from 0 to
// vocabSize() - 1 (65.5, 2**32 + 1, NaN, "68", -1 throw, naming the value); a count (backtrack, a
// state) an integer from 0 to 2**32 - 1; a temperature a finite number >= 0. A result's fields are
// read from its own properties only (never from a prototype).
//
// Two ways to write a controller: the async library (`aici.start(async () => { ... })` with `gen`,
// `$`, `fork`, `waitVars`, `Label`: see "The async library" below and docs/js.md), or
// `midProcess(arg)` by hand (a function declaration, `const`/`let`/`var`, `export function` in a
// module, or an `async function`: its promise is settled by the jobs run after each call).

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

/** Defined by the script (or supplied by the library when the script calls aici.start). */
declare function midProcess(arg: MidProcessArg): MidProcessResult | Promise<MidProcessResult>;

/** Options of gen(): at most one constraint (regex, options, grammar, jsonSchema). */
interface GenOptions {
  /** The SDK's regex syntax (a whole-string match), or a RegExp whose `source` is used. */
  regex?: string | RegExp;
  /** Exactly one of these strings (aici.choice: a native trie). */
  options?: string[];
  /** Lark/GBNF text (a new aici.Grammar), an aici.Grammar, or an aici.Regex / aici.JsonSchema. */
  grammar?: string | aici.Grammar | aici.Regex | aici.JsonSchema;
  /** A JSON Schema (object or JSON text) or an aici.JsonSchema. */
  jsonSchema?: object | string | aici.JsonSchema;
  /** End when the generated text contains this (kept in the sequence, not in the result). */
  stopAt?: string;
  /** An integer from 1 to 2**32 - 1. */
  maxTokens?: number;
  /** Also write the result to this variable. */
  storeVar?: string;
  /** A finite number >= 0, for this gen's steps. */
  temperature?: number;
}

/** A point in the sequence to come back to. */
declare class Label {
  /** The current end of the sequence. */
  constructor();
  readonly pos: number;
  tokensSince(): number[];
  textSince(): string;
  /** Take back everything after the label (needs backtrack), then append `text` (needs ff-tokens). */
  fixedAfter(text: string): Promise<void>;
}

type LabelClass = typeof Label;

// ---- the async library (also on `aici`, and the named exports of `import ... from "aici"`) -----
/** Run `main` as this request's controller: each await on the library below resumes at the next
 *  mid-process call. Once per script; the script then needs no midProcess. */
declare function start(main: () => Promise<void> | void): void;
/** Tagged template: append the text (one fast-forward where the host grants ff-tokens, else forced
 *  by masks one token a step). */
declare function $(strings: TemplateStringsArray, ...values: unknown[]): Promise<void>;
declare function fixed(text: string): Promise<void>;
/** Generate until the constraint's match is complete, EOS, stopAt or maxTokens; the text (without
 *  stopAt). Tokens the constraint forces are fast-forwarded where the host grants ff-tokens, and
 *  with conditional ff-tokens each allowed token of a small mask (<= 64) carries the tokens forced
 *  after it. A sampled EOS is taken back (conditional splice) where the host grants conditional
 *  ff-tokens and backtrack, so the script goes on; elsewhere EOS ends the sequence. */
declare function gen(options?: GenOptions): Promise<string>;
/** Fork into n sequences (1 to 1024); resolves in each with its index (0: the parent). */
declare function fork(n: number): Promise<number>;
/** No-op steps until every variable is set; their values. A last argument {maxSteps} (default
 *  1000) bounds the wait (then it throws). */
declare function waitVars(...names: (string | { maxSteps?: number })[]): Promise<string[]>;
declare function getPrompt(): string;
declare function getTokens(): number[];
declare function setVar(name: string, value: string): void;
declare function getVar(name: string): string | undefined;
declare function appendVar(name: string, value: string): void;

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

  /** What Regex and JsonSchema share: a constraint whose states are numbers (0: dead), its
   *  masks computed natively. */
  interface Constraint {
    start(): number;
    /** The state after the bytes of a token (or of each token, in order); 0 once dead.
     *  A token without bytes (a special token) leaves the state unchanged. RangeError for a
     *  state this constraint never gave out or a token id >= vocabSize(). */
    advance(state: number, tokens: number | number[]): number;
    accepting(state: number): boolean;
    /** Some byte keeps the match going. */
    canContinue(state: number): boolean;
    /** The tokens that keep the text a prefix of the language, plus EOS where `state` accepts.
     *  Read-only: copy() it to change it. A Regex's masks are cached per state for good; a
     *  JsonSchema's are valid until its next mask() of another state (a stale one throws). */
    mask(state: number): TokenSet;
  }
  /** The SDK's regex (a whole-string match; syntax: docs/writing-controllers.md), as a DFA: the
   *  C `regex` controller's matcher. */
  class Regex implements Constraint {
    /** Throws SyntaxError naming the offset of a bad pattern. */
    constructor(pattern: string);
    start(): number;
    advance(state: number, tokens: number | number[]): number;
    accepting(state: number): boolean;
    canContinue(state: number): boolean;
    mask(state: number): TokenSet;
  }
  /** Options of a JsonSchema (also read from the schema root's "x-aicirt", as the json
   *  controller does; snake_case names are accepted too). */
  interface JsonSchemaOptions {
    /** Up to this many whitespace bytes between tokens (default 0: compact JSON). */
    whitespace?: number;
    /** Object keys in any order, each at most once (default: schema order). */
    anyOrder?: boolean;
    /** oneOf whose branches may overlap compiled as anyOf. */
    coerceOneOf?: boolean;
    /** Keywords not enforced (each stated in the log). */
    ignore?: string[];
  }
  /** A JSON Schema through the `json` controller's compiler and pushdown matcher (its masks bit
   *  for bit; docs/json.md lists what it supports). States number the matcher's configuration
   *  sets as they are reached. */
  class JsonSchema implements Constraint {
    /** `schema`: an object, or its JSON text. Throws SyntaxError for text that is not JSON,
     *  TypeError for an unknown option or a schema it cannot enforce ("JsonSchema: unsupported:
     *  KEYWORD at POINTER ...") or one that admits no document. */
    constructor(schema: object | string, options?: JsonSchemaOptions);
    start(): number;
    advance(state: number, tokens: number | number[]): number;
    accepting(state: number): boolean;
    canContinue(state: number): boolean;
    mask(state: number): TokenSet;
  }
  /** A context-free grammar through the `grammar` controller's Earley matcher (docs/grammar.md):
   *  Lark as llguidance reads it, or GBNF (detected when the first definition uses `::=`, or
   *  chosen by `syntax`). The matcher holds one position: a state is a point on the current path
   *  of text, and advancing from a state drops the states after it (using one then throws
   *  RangeError). Masks share one buffer, as JsonSchema's (copy() keeps one). */
  class Grammar implements Constraint {
    /** Throws SyntaxError naming the construct and its line for a grammar it cannot compile. */
    constructor(grammar: string, options?: { syntax?: "lark" | "gbnf" });
    start(): number;
    advance(state: number, tokens: number | number[]): number;
    accepting(state: number): boolean;
    canContinue(state: number): boolean;
    mask(state: number): TokenSet;
  }
  /** A constraint run over the generated tokens natively, one call a step: what the C `regex`
   *  and `json` controllers do (json with fast_forward=0: it samples every token). The prompt is
   *  what the sequence held at the first step(); backtracking is followed (the tokens are
   *  compared with those it followed, so a step() may skip calls). */
  class Follower {
    constructor(constraint: Constraint);
    /** This call's result: stop when EOS was sampled, the text no longer matches (logged), or
     *  a complete match cannot continue; else sample under the state's mask. Return it from
     *  midProcess as is (it converts without a property walk); `.branches` shows the plain
     *  form. TypeError outside midProcess. */
    step(): MidProcessResult;
    /** The constraint's state after the tokens followed (as of the last step()). */
    readonly state: number;
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

  /** A Regex whose language is exactly these strings (non-empty; up to 65,536 of them): a trie
   *  of their bytes as a native DFA, masks cached per state. */
  function choice(options: string[]): Regex;
  /** The per-tokenizer init: runs `fn` now and returns its value. In a script bound into a module
   *  (`aicirt build/upload ctrl.js`) that calls it, the script is evaluated by the module's init,
   *  once per tokenizer, and every request starts from what its top level and `fn` built; there
   *  they may use what an init may (vocabSize, eosToken, tokenize, detokenize, tokenBytes, log, the
   *  constraints), not the request's (arg, variables, capabilities, ...). A script given as the
   *  argument runs it on each request's first call. Not a global: `aici.init` or the import. */
  function init<T>(fn: () => T): T;
  const start: typeof globalThis.start, $: typeof globalThis.$, fixed: typeof globalThis.fixed,
    gen: typeof globalThis.gen, fork: typeof globalThis.fork, waitVars: typeof globalThis.waitVars,
    getPrompt: typeof globalThis.getPrompt, getTokens: typeof globalThis.getTokens,
    setVar: typeof globalThis.setVar, getVar: typeof globalThis.getVar, appendVar: typeof globalThis.appendVar;
  const Label: LabelClass;

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

/** `import {start, gen, $} from "aici"` (or "@aicirt/aici") in a module script: the library and
 *  the API as named exports, `aici` itself as the default export. */
declare module "aici" {
  export const init: typeof aici.init;
  export const start: typeof globalThis.start, $: typeof globalThis.$, fixed: typeof globalThis.fixed,
    gen: typeof globalThis.gen, fork: typeof globalThis.fork, waitVars: typeof globalThis.waitVars,
    getPrompt: typeof globalThis.getPrompt, getTokens: typeof globalThis.getTokens,
    setVar: typeof globalThis.setVar, getVar: typeof globalThis.getVar, appendVar: typeof globalThis.appendVar;
  export const Label: LabelClass;
  export const TokenSet: typeof aici.TokenSet, Regex: typeof aici.Regex, JsonSchema: typeof aici.JsonSchema,
    Grammar: typeof aici.Grammar, Follower: typeof aici.Follower;
  export const choice: typeof aici.choice, Cap: typeof aici.Cap, stop: typeof aici.stop, sample: typeof aici.sample,
    fastForward: typeof aici.fastForward, noop: typeof aici.noop, vocabSize: typeof aici.vocabSize,
    eosToken: typeof aici.eosToken, selfSeqId: typeof aici.selfSeqId, capabilities: typeof aici.capabilities,
    tokenize: typeof aici.tokenize, detokenize: typeof aici.detokenize, tokenBytes: typeof aici.tokenBytes,
    arg: typeof aici.arg, allTokens: typeof aici.allTokens, varGet: typeof aici.varGet, varSet: typeof aici.varSet,
    varAppend: typeof aici.varAppend, log: typeof aici.log;
  const _default: typeof aici;
  export default _default;
}
declare module "@aicirt/aici" {
  export * from "aici";
  import a from "aici";
  export default a;
}
