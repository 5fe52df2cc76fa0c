// The async controller library of the js controller (docs/js.md, typed in aici.d.ts): compiled
// into the module (main.c #embeds this file) and evaluated by the init, so it is part of the init
// snapshot. A script calls aici.start(async () => { ... }) and writes its controller as straight
// code: `await $\`text\``, `await gen({...})`, `await fork(n)`, `await waitVars(...)`. Each await
// on the library suspends the script until the host's next mid-process call: the library's own
// midProcess hands the host the step the script asked for, and the next call's argument resumes
// it (main.c runs the promise jobs after every call).
(function (aici) {
  "use strict";
  const DEFAULT_MAX_WAIT = 1000;      // waitVars: steps before it gives up
  const LOOKAHEAD_MAX = 64;           // gen: conditional fast-forward computed for masks this small
  let mainFn = null, running = false, finished = false;
  let toks = [], promptLen = 0, callArg = null, caps = 0;
  let resolveStep = null, rejectStep = null, wake = null;
  let nCalls = 0, failure = null;     // failure: the script's error, thrown between calls
  let floor = 0;                      // the start of the running action: text before it is used
  const regexCache = new Map();

  const isInt = (v, lo, hi) => typeof v === "number" && Number.isInteger(v) && v >= lo && v <= hi;
  const describe = v => typeof v === "string" ? JSON.stringify(v) : typeof v === "symbol" ? "a Symbol"
      : v === null ? "null" : typeof v === "object" ? (Array.isArray(v) ? "an array" : "an object")
      : typeof v === "function" ? "a function" : String(v);
  function own(o, k) { return Object.prototype.hasOwnProperty.call(o, k) ? o[k] : undefined; }
  function checkKeys(o, allowed, what) {
    if (o === null || typeof o !== "object" || Array.isArray(o)) throw new TypeError(`${what}: expected an options object, got ${describe(o)}`);
    for (const k of Object.keys(o))
      if (!allowed.includes(k)) throw new TypeError(`${what}: unknown option '${k}' (options: ${allowed.join(", ")})`);
  }
  const noopBranch = () => ({splices: [{backtrack: 0, ffTokens: []}]});

  // ---- the step protocol -------------------------------------------------------------------------
  // The library's midProcess: follows the sequence, resumes the script, and returns a promise
  // that the script's next step (or its end) settles; main.c runs the jobs, then reads it.
  function libMidProcess(arg) {
    if (arg.backtrack) toks.length = Math.max(0, toks.length - arg.backtrack);
    for (const t of arg.tokens) toks.push(t);
    callArg = arg;
    nCalls++;
    const p = new Promise((res, rej) => { resolveStep = res; rejectStep = rej; });
    if (failure) {
      fail(failure);
    } else if (running && !finished && toks.length < floor) {
      // the host took back text the script already used (a gen's result, a fork's point): a
      // coroutine cannot go back, so the sequence stops, saying why
      aici.log(`aici: the host took back ${floor - toks.length} token(s) the script had already used; stopping`);
      finish();
    } else if (finished) {
      finish();                        // a call after the end (the host did not stop): stop again
    } else if (!running) {
      running = true;
      caps = aici.capabilities();
      promptLen = toks.length;
      Promise.resolve().then(mainFn).then(finish, fail);
    } else if (wake) {
      const w = wake;
      wake = null;
      w(arg);
    } else {
      finish();
    }
    return p;
  }
  function settle(result) {
    const r = resolveStep;
    resolveStep = rejectStep = null;
    if (r) r(result);
  }
  function finish() { finished = true; settle({branches: []}); }
  function fail(e) {
    finished = true;
    const r = rejectStep;
    resolveStep = rejectStep = null;
    if (r) r(e); else failure = e;   // reported by the next call
  }
  // One step: hand the host these branches; resolves with the next call's argument.
  function stepWith(branches) {
    if (!resolveStep) {
      throw new Error(finished ? "aici: a step after the controller finished"
                               : "aici: two steps at once (await each gen/$/fork before the next)");
    }
    settle({branches});
    return new Promise(res => { wake = res; });
  }

  // ---- what the script can read --------------------------------------------------------------------
  function getTokens() { return toks.slice(); }
  function getPrompt() { return aici.detokenize(toks.slice(0, promptLen)); }
  function hasCap(c) { return (caps & c) === c; }

  // ---- fixed text -------------------------------------------------------------------------------
  // Append `text` (tokenized on its own): one fast-forward step where the host grants ff-tokens,
  // else forced one token a step by masks.
  async function fixed(text) {
    if (typeof text !== "string") throw new TypeError(`fixed: expected a string, got ${describe(text)}`);
    const t = aici.tokenize(text);
    const start = floor = toks.length;
    for (;;) {   // host backtracks inside the text: its missing tail is appended again
      const k = toks.length - start;
      for (let j = 0; j < k; j++)
        if (toks[start + j] !== t[j]) throw new Error("fixed: the host appended other tokens than the text");
      if (k >= t.length) return;
      if (hasCap(aici.Cap.FF_TOKENS)) await stepWith([{splices: [{backtrack: 0, ffTokens: t.slice(k)}]}]);
      else await stepWith([{sampleMask: new aici.TokenSet([t[k]])}]);
    }
  }
  function $(strings, ...values) {
    if (!Array.isArray(strings) || !Array.isArray(strings.raw)) throw new TypeError("$ is a template tag: $`text`");
    let s = strings[0];
    for (let i = 0; i < values.length; i++) s += String(values[i]) + strings[i + 1];
    return fixed(s);
  }

  // ---- gen ------------------------------------------------------------------------------------------
  const GEN_KEYS = ["regex", "options", "grammar", "jsonSchema", "stopAt", "maxTokens", "storeVar", "temperature"];
  function constraintOf(o) {
    const given = ["regex", "options", "grammar", "jsonSchema"].filter(k => own(o, k) !== undefined && own(o, k) !== null);
    if (given.length > 1) throw new TypeError(`gen: at most one of regex, options, grammar, jsonSchema (got ${given.join(", ")})`);
    if (!given.length) return null;
    const v = own(o, given[0]);
    switch (given[0]) {
      case "regex": {
        const src = v instanceof RegExp ? v.source : v;
        if (typeof src !== "string") throw new TypeError(`gen: regex must be a string or RegExp, got ${describe(v)}`);
        let re = regexCache.get(src);
        if (!re) regexCache.set(src, re = new aici.Regex(src));
        return re;
      }
      case "options": {
        if (!Array.isArray(v) || !v.length) throw new TypeError("gen: options must be a non-empty array of strings");
        const key = "\0choice\0" + JSON.stringify(v);
        let re = regexCache.get(key);
        if (!re) regexCache.set(key, re = aici.choice(v));
        return re;
      }
      case "grammar": {
        if (v instanceof aici.Grammar || v instanceof aici.Regex || v instanceof aici.JsonSchema) return v;
        if (typeof v !== "string") throw new TypeError(`gen: grammar must be Lark/GBNF text or an aici.Grammar, got ${describe(v)}`);
        // a Grammar's matcher holds one position: a fresh one per gen(), not shared through a cache
        return new aici.Grammar(v);
      }
      case "jsonSchema":
        return v instanceof aici.JsonSchema ? v : new aici.JsonSchema(v);
    }
  }
  // The tokens forced after state `st` (the only token its mask allows, while it does not accept).
  function forcedAfter(c, st, limit) {
    const out = [];
    while (out.length < limit && st && !c.accepting(st)) {
      const m = c.mask(st);
      if (m.count() !== 1) break;
      const t = m.tokens()[0];
      out.push(t);
      st = c.advance(st, t);
    }
    return out;
  }

  // Generate tokens: under a constraint (regex, options, grammar, jsonSchema) or free, until the
  // constraint's match is complete, EOS, stopAt appears in the text, or maxTokens. Returns the
  // text (without stopAt and EOS); storeVar: also written to that variable.
  async function gen(o = {}) {
    checkKeys(o, GEN_KEYS, "gen");
    const c = constraintOf(o);
    const stopAt = own(o, "stopAt"), maxTokens = own(o, "maxTokens"), storeVar = own(o, "storeVar");
    const temperature = own(o, "temperature");
    if (stopAt !== undefined && (typeof stopAt !== "string" || !stopAt.length)) throw new TypeError(`gen: stopAt must be a non-empty string, got ${describe(stopAt)}`);
    if (maxTokens !== undefined && !isInt(maxTokens, 1, 0xffffffff)) throw new RangeError(`gen: maxTokens must be an integer from 1 to 2^32-1, got ${describe(maxTokens)}`);
    if (storeVar !== undefined && typeof storeVar !== "string") throw new TypeError(`gen: storeVar must be a string, got ${describe(storeVar)}`);
    if (temperature !== undefined && !(typeof temperature === "number" && Number.isFinite(temperature) && temperature >= 0))
      throw new RangeError(`gen: temperature must be a finite number >= 0, got ${describe(temperature)}`);
    const eos = aici.eosToken(), start = floor = toks.length, limit = maxTokens === undefined ? Infinity : maxTokens;
    const ff = hasCap(aici.Cap.FF_TOKENS), cff = ff && hasCap(aici.Cap.CONDITIONAL_FF_TOKENS);
    // EOS ends the sequence unless a splice takes it back: where the host allows, it does, so
    // that the script goes on after this gen().
    const eosBack = hasCap(aici.Cap.CONDITIONAL_FF_TOKENS | aici.Cap.BACKTRACK);
    const startCall = nCalls, any = c ? null : new aici.TokenSet().fill();
    let st = c ? c.start() : 0, nFollowed = 0, cut = -1;
    for (;;) {
      const n = toks.length - start;
      if (n < 0) throw new Error("gen: the host backtracked into the text before gen()");
      if (c) {
        if (nFollowed > n) { st = c.advance(c.start(), toks.slice(start)); nFollowed = n; }
        else if (nFollowed < n) { st = c.advance(st, toks.slice(start + nFollowed)); nFollowed = n; }
      }
      if (nCalls > startCall && callArg.sampled === eos) break;   // taken back by the splice below
      if (stopAt !== undefined) {
        const text = aici.detokenize(toks.slice(start)), at = text.indexOf(stopAt);
        if (at >= 0) { cut = at; break; }
      }
      if (n >= limit) break;
      if (c) {
        if (!st) { aici.log("gen: the text no longer matches the constraint"); break; }
        if (c.accepting(st) && !c.canContinue(st)) break;
      }
      const branch = {}, splices = [];
      let mask = any;
      if (c) {
        mask = c.mask(st);
        if (mask.isEmpty()) { aici.log("gen: no token can continue the match"); break; }
        if (ff && !c.accepting(st)) {
          const forced = forcedAfter(c, st, limit - n);
          if (forced.length) { await stepWith([{splices: [{backtrack: 0, ffTokens: forced}]}]); continue; }
        }
        if (cff && mask.count() <= LOOKAHEAD_MAX) {
          if (!(c instanceof aici.Regex)) mask = mask.copy();     // its next mask() replaces this one
          for (const t of mask.tokens()) {
            if (t === eos) continue;
            const after = forcedAfter(c, c.advance(st, t), limit - n - 1);
            if (after.length) splices.push({whenSampled: [t], backtrack: 0, ffTokens: after});
          }
        }
      }
      if (eosBack && mask.has(eos)) splices.push({whenSampled: [eos], backtrack: 1, ffTokens: []});
      branch.sampleMask = mask;
      if (splices.length) branch.splices = splices;
      if (temperature !== undefined) branch.temperature = temperature;
      await stepWith([branch]);
    }
    let text = aici.detokenize(toks.slice(start));
    if (cut >= 0) text = text.slice(0, cut);
    if (storeVar !== undefined) aici.varSet(storeVar, text);
    return text;
  }

  // ---- fork and variables ------------------------------------------------------------------------------
  // Fork into n sequences; each resumes here with its index (0: this sequence, the parent).
  async function fork(n) {
    if (!isInt(n, 1, 1024)) throw new RangeError(`fork: n must be an integer from 1 to 1024, got ${describe(n)}`);
    if (n === 1) return 0;
    if (!hasCap(aici.Cap.FORK)) throw new Error("fork: the host grants no fork");
    const branches = [];
    floor = toks.length;
    for (let i = 0; i < n; i++) branches.push(noopBranch());
    const arg = await stepWith(branches);
    const i = arg.forkGroup.indexOf(aici.selfSeqId());
    return i < 0 ? 0 : i;
  }
  // Wait (one no-op step at a time) until every named variable is set; their values.
  async function waitVars(...names) {
    let maxSteps = DEFAULT_MAX_WAIT;
    if (names.length && typeof names[names.length - 1] === "object" && names[names.length - 1] !== null) {
      const o = names.pop();
      checkKeys(o, ["maxSteps"], "waitVars");
      if (o.maxSteps !== undefined) {
        if (!isInt(o.maxSteps, 0, 0xffffffff)) throw new RangeError(`waitVars: maxSteps must be an integer >= 0, got ${describe(o.maxSteps)}`);
        maxSteps = o.maxSteps;
      }
    }
    for (const n of names) if (typeof n !== "string") throw new TypeError(`waitVars: variable names are strings, got ${describe(n)}`);
    for (let step = 0; ; step++) {
      const vals = names.map(n => aici.varGet(n));
      if (vals.every(v => v !== undefined)) return vals;
      if (step >= maxSteps) throw new Error(`waitVars: ${names.filter((n, i) => vals[i] === undefined).join(", ")} still unset after ${maxSteps} steps`);
      await stepWith([noopBranch()]);
    }
  }

  // ---- labels ------------------------------------------------------------------------------------------
  // A point in the sequence to come back to: backtrack to it and append other text.
  class Label {
    constructor() { this.pos = toks.length; }
    tokensSince() { return toks.slice(this.pos); }
    textSince() { return aici.detokenize(toks.slice(this.pos)); }
    // Take back everything after the label, then append `text` (may be "").
    async fixedAfter(text) {
      if (typeof text !== "string") throw new TypeError(`Label.fixedAfter: expected a string, got ${describe(text)}`);
      if (toks.length < this.pos) throw new Error("Label.fixedAfter: the sequence is already shorter than the label");
      const back = toks.length - this.pos, t = aici.tokenize(text);
      if (back && !hasCap(aici.Cap.BACKTRACK)) throw new Error("Label.fixedAfter: the host grants no backtrack");
      if (t.length && !hasCap(aici.Cap.FF_TOKENS)) throw new Error("Label.fixedAfter: the host grants no ff-tokens");
      floor = this.pos;
      if (back || t.length) await stepWith([{splices: [{backtrack: back, ffTokens: t}]}]);
    }
  }

  function start(fn) {
    if (typeof fn !== "function") throw new TypeError(`aici.start: expected an (async) function, got ${describe(fn)}`);
    if (mainFn) throw new Error("aici.start: called twice");
    mainFn = fn;
  }
  // The per-tokenizer init: fn runs now, where the script is evaluated. A bound script that calls
  // aici.init is evaluated by the init, once per tokenizer, and every request starts from its state
  // (runtime/loader/js_bind.py, docs/js.md); a script given as the argument is evaluated on its first call.
  function init(fn) {
    if (typeof fn !== "function") throw new TypeError(`aici.init: expected a function, got ${describe(fn)}`);
    return fn();
  }
  const setVar = (name, value) => aici.varSet(name, value);
  const getVar = name => aici.varGet(name);
  const appendVar = (name, value) => aici.varAppend(name, value);

  const lib = {start, init, $, fixed, gen, fork, waitVars, Label, getPrompt, getTokens, setVar, getVar, appendVar};
  Object.assign(aici, lib);
  Object.defineProperty(aici, "_libMidProcess", {value: libMidProcess});
  Object.defineProperty(aici, "_libStarted", {get: () => mainFn !== null});
  for (const k of Object.keys(lib)) if (k !== "start" && k !== "init") globalThis[k] = lib[k];
})(aici);
