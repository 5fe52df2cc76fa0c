/* A small JSON reader into a DOM (the schema), and the text helpers the compiler writes with. */
#include "json.h"

typedef struct { const char *s; uint32_t n, i; const char *err; uint32_t depth; } rd_t;

jv_t *jv_new(uint8_t kind) {
  jv_t *v = aici_calloc(1, sizeof *v);
  v->kind = kind;
  return v;
}

static void ws(rd_t *r) {
  while (r->i < r->n && (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' || r->s[r->i] == '\r')) r->i++;
}

static int hex4(const char *s) {
  int v = 0;
  for (int k = 0; k < 4; k++) {
    int d = aici_hex_digit((uint8_t)s[k]);
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

static bool read_str(rd_t *r, jv_t *v) {
  r->i++;                              /* the opening quote */
  aici_buf_t b = {0};
  while (r->i < r->n && r->s[r->i] != '"') {
    uint8_t c = (uint8_t)r->s[r->i++];
    if (c < 0x20) { r->err = "control character in string"; return false; }
    if (c != '\\') { aici_buf_putc(&b, (char)c); continue; }
    if (r->i >= r->n) break;
    char e = r->s[r->i++];
    switch (e) {
      case '"': case '\\': case '/': aici_buf_putc(&b, e); break;
      case 'b': aici_buf_putc(&b, '\b'); break;
      case 'f': aici_buf_putc(&b, '\f'); break;
      case 'n': aici_buf_putc(&b, '\n'); break;
      case 'r': aici_buf_putc(&b, '\r'); break;
      case 't': aici_buf_putc(&b, '\t'); break;
      case 'u': {
        int u = r->i + 4 <= r->n ? hex4(r->s + r->i) : -1;
        if (u < 0) { r->err = "bad \\u escape"; return false; }
        r->i += 4;
        uint32_t cp = (uint32_t)u;
        if (cp >= 0xd800 && cp < 0xdc00 && r->i + 6 <= r->n && r->s[r->i] == '\\' && r->s[r->i + 1] == 'u') {
          int lo = hex4(r->s + r->i + 2);
          if (lo >= 0xdc00 && lo < 0xe000) cp = 0x10000 + ((cp - 0xd800) << 10) + ((uint32_t)lo - 0xdc00), r->i += 6;
        }
        uint8_t u8[4];
        aici_buf_putn(&b, u8, aici_utf8_encode(cp, u8));
        break;
      }
      default: r->err = "bad escape"; return false;
    }
  }
  if (r->i >= r->n) { r->err = "unterminated string"; return false; }
  r->i++;
  aici_buf_putc(&b, 0);
  v->kind = JV_STR, v->s = b.p, v->n = b.n - 1;
  return true;
}

static double parse_double(const char *s, uint32_t n) {
  double v = 0, sign = 1;
  uint32_t i = 0;
  if (i < n && s[i] == '-') sign = -1, i++;
  while (i < n && s[i] >= '0' && s[i] <= '9') v = v * 10 + (s[i++] - '0');
  if (i < n && s[i] == '.') {
    double f = 0.1;
    for (i++; i < n && s[i] >= '0' && s[i] <= '9'; i++, f /= 10) v += (s[i] - '0') * f;
  }
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    int es = 1, e = 0;
    i++;
    if (i < n && (s[i] == '+' || s[i] == '-')) es = s[i++] == '-' ? -1 : 1;
    while (i < n && s[i] >= '0' && s[i] <= '9' && e < 10000) e = e * 10 + (s[i++] - '0');
    for (; e > 0; e--) v = es > 0 ? v * 10 : v / 10;
  }
  return sign * v;
}

static bool read_value(rd_t *r, jv_t *v);

static bool read_items(rd_t *r, jv_t *v, bool obj) {
  uint32_t cap = 0;
  r->i++;
  ws(r);
  char close = obj ? '}' : ']';
  if (r->i < r->n && r->s[r->i] == close) { r->i++; return true; }
  for (;;) {
    if (v->n == cap) {
      cap = cap ? 2 * cap : 4;
      v->items = aici_realloc(v->items, cap * sizeof(jv_t));
      if (obj) v->keys = aici_realloc(v->keys, cap * sizeof(jv_t));
    }
    jv_t *it = &v->items[v->n];
    __builtin_memset(it, 0, sizeof *it);
    ws(r);
    if (obj) {
      jv_t *k = &v->keys[v->n];
      __builtin_memset(k, 0, sizeof *k);
      if (r->i >= r->n || r->s[r->i] != '"') { r->err = "expected a key"; return false; }
      if (!read_str(r, k)) return false;
      ws(r);
      if (r->i >= r->n || r->s[r->i] != ':') { r->err = "expected ':'"; return false; }
      r->i++;
    }
    if (!read_value(r, it)) return false;
    v->n++;
    ws(r);
    if (r->i < r->n && r->s[r->i] == ',') { r->i++; continue; }
    if (r->i < r->n && r->s[r->i] == close) { r->i++; return true; }
    r->err = obj ? "expected ',' or '}'" : "expected ',' or ']'";
    return false;
  }
}

static bool lit(rd_t *r, const char *w, uint8_t kind, jv_t *v) {
  uint32_t n = 0;
  while (w[n]) n++;
  if (r->i + n > r->n || __builtin_memcmp(r->s + r->i, w, n)) { r->err = "unexpected character"; return false; }
  r->i += n, v->kind = kind;
  return true;
}

static bool read_value(rd_t *r, jv_t *v) {
  ws(r);
  if (r->i >= r->n) { r->err = "unexpected end"; return false; }
  if (++r->depth > 200) { r->err = "nested too deeply"; return false; }
  bool ok;
  char c = r->s[r->i];
  if (c == '{') v->kind = JV_OBJ, ok = read_items(r, v, true);
  else if (c == '[') v->kind = JV_ARR, ok = read_items(r, v, false);
  else if (c == '"') ok = read_str(r, v);
  else if (c == 't') ok = lit(r, "true", JV_TRUE, v);
  else if (c == 'f') ok = lit(r, "false", JV_FALSE, v);
  else if (c == 'n') ok = lit(r, "null", JV_NULL, v);
  else if (c == '-' || (c >= '0' && c <= '9')) {
    uint32_t s = r->i;
    if (r->s[r->i] == '-') r->i++;
    uint32_t d = r->i;
    while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') r->i++;
    ok = r->i > d;
    if (ok && r->i < r->n && r->s[r->i] == '.') {
      d = ++r->i;
      while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') r->i++;
      ok = r->i > d;
    }
    if (ok && r->i < r->n && (r->s[r->i] == 'e' || r->s[r->i] == 'E')) {
      r->i++;
      if (r->i < r->n && (r->s[r->i] == '+' || r->s[r->i] == '-')) r->i++;
      d = r->i;
      while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') r->i++;
      ok = r->i > d;
    }
    if (!ok) r->err = "bad number";
    v->kind = JV_NUM, v->s = r->s + s, v->n = r->i - s, v->num = parse_double(v->s, v->n);
  } else {
    r->err = "unexpected character";
    ok = false;
  }
  r->depth--;
  return ok;
}

jv_t *jv_parse(const char *text, uint32_t len, const char **err, uint32_t *at) {
  rd_t r = {.s = text, .n = len};
  jv_t *v = jv_new(JV_NULL);
  if (read_value(&r, v)) {
    ws(&r);
    if (r.i == r.n) return v;
    r.err = "trailing characters";
  }
  *err = r.err, *at = r.i;
  return 0;
}

bool jv_str_is(const jv_t *v, const char *s) {
  if (!v || v->kind != JV_STR) return false;
  if (!v->n || v->s[0] != s[0]) return !v->n && !s[0];   /* most keyword tests end here */
  uint32_t n = 0;
  while (s[n]) n++;
  return v->n == n && !__builtin_memcmp(v->s, s, n);
}

const jv_t *jv_get(const jv_t *obj, const char *key) {
  if (!obj || obj->kind != JV_OBJ) return 0;
  const jv_t *found = 0;
  for (uint32_t i = 0; i < obj->n; i++)   /* the last of duplicate keys wins, as in Python */
    if (jv_str_is(&obj->keys[i], key)) found = &obj->items[i];
  return found;
}

bool jv_is_int(const jv_t *v) {
  if (v->kind != JV_NUM) return false;
  for (uint32_t i = 0; i < v->n; i++)
    if (v->s[i] == '.' || v->s[i] == 'e' || v->s[i] == 'E') return v->num == (double)(int64_t)v->num;
  return true;
}

bool jv_equal(const jv_t *a, const jv_t *b) {
  bool an = a->kind == JV_NUM, bn = b->kind == JV_NUM;
  if (an || bn) return an && bn && a->num == b->num;
  if (a->kind != b->kind) return false;
  if (a->kind == JV_STR) return a->n == b->n && !__builtin_memcmp(a->s, b->s, a->n);
  if (a->kind == JV_ARR) {
    if (a->n != b->n) return false;
    for (uint32_t i = 0; i < a->n; i++)
      if (!jv_equal(&a->items[i], &b->items[i])) return false;
    return true;
  }
  if (a->kind == JV_OBJ) {
    if (a->n != b->n) return false;
    for (uint32_t i = 0; i < a->n; i++) {
      bool found = false;
      for (uint32_t j = 0; j < b->n && !found; j++)
        found = a->keys[i].n == b->keys[j].n && !__builtin_memcmp(a->keys[i].s, b->keys[j].s, a->keys[i].n) &&
                jv_equal(&a->items[i], &b->items[j]);
      if (!found) return false;
    }
    return true;
  }
  return true;
}

void jv_obj_put(jv_t *obj, const char *key, uint32_t klen, const jv_t *val) {
  uint32_t n = obj->n;
  if ((n & (n - 1)) == 0) {            /* capacity: the next power of two */
    obj->items = aici_realloc(obj->items, (n ? 2 * n : 1) * sizeof(jv_t));
    obj->keys = aici_realloc(obj->keys, (n ? 2 * n : 1) * sizeof(jv_t));
  }
  __builtin_memset(&obj->keys[n], 0, sizeof(jv_t));
  obj->keys[n].kind = JV_STR, obj->keys[n].s = key, obj->keys[n].n = klen;
  obj->items[n] = *val;
  obj->n = n + 1;
}

/* ---- text --------------------------------------------------------------------------------- */
void sb_byte(aici_buf_t *b, uint8_t c) {
  if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
    aici_buf_putc(b, (char)c);
    return;
  }
  static const char hx[] = "0123456789abcdef";
  char e[4] = {'\\', 'x', hx[c >> 4], hx[c & 15]};
  aici_buf_putn(b, e, 4);
}

void sb_lit(aici_buf_t *b, const char *s, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) sb_byte(b, (uint8_t)s[i]);
}

void sb_uint(aici_buf_t *b, uint64_t v) {
  char t[24];
  int k = 0;
  do t[k++] = (char)('0' + v % 10), v /= 10; while (v);
  while (k) aici_buf_putc(b, t[--k]);
}

void jv_write_str(aici_buf_t *b, const char *s, uint32_t n) {
  static const char hx[] = "0123456789abcdef";
  aici_buf_putc(b, '"');
  for (uint32_t i = 0; i < n; i++) {
    uint8_t c = (uint8_t)s[i];
    if (c == '"') aici_buf_puts(b, "\\\"");
    else if (c == '\\') aici_buf_puts(b, "\\\\");
    else if (c == '\n') aici_buf_puts(b, "\\n");
    else if (c == '\r') aici_buf_puts(b, "\\r");
    else if (c == '\t') aici_buf_puts(b, "\\t");
    else if (c == '\b') aici_buf_puts(b, "\\b");
    else if (c == '\f') aici_buf_puts(b, "\\f");
    else if (c < 0x20) {
      char e[6] = {'\\', 'u', '0', '0', hx[c >> 4], hx[c & 15]};
      aici_buf_putn(b, e, 6);
    } else aici_buf_putc(b, (char)c);
  }
  aici_buf_putc(b, '"');
}

void jv_write(aici_buf_t *b, const jv_t *v) {
  switch (v->kind) {
    case JV_NULL: aici_buf_puts(b, "null"); break;
    case JV_TRUE: aici_buf_puts(b, "true"); break;
    case JV_FALSE: aici_buf_puts(b, "false"); break;
    case JV_NUM: aici_buf_putn(b, v->s, v->n); break;
    case JV_STR: jv_write_str(b, v->s, v->n); break;
    case JV_ARR:
      aici_buf_putc(b, '[');
      for (uint32_t i = 0; i < v->n; i++) {
        if (i) aici_buf_putc(b, ',');
        jv_write(b, &v->items[i]);
      }
      aici_buf_putc(b, ']');
      break;
    default:
      aici_buf_putc(b, '{');
      for (uint32_t i = 0; i < v->n; i++) {
        if (i) aici_buf_putc(b, ',');
        jv_write_str(b, v->keys[i].s, v->keys[i].n);
        aici_buf_putc(b, ':');
        jv_write(b, &v->items[i]);
      }
      aici_buf_putc(b, '}');
  }
}
