import json, os
D = "/work/wt-grammar/tests/grammars"
G = {}
G["json"] = (r'''
start: value
?value: object | array | string | SIGNED_NUMBER | "true" | "false" | "null"
array: "[" [value ("," value)*] "]"
object: "{" [pair ("," pair)*] "}"
pair: string ":" value
string: ESCAPED_STRING
%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
''', ['{"a": 1}', '[1, 2.5, -3e2, "x"]', '{"k": {"n": [true, false, null]}}', '"just a string"', '[]', '{}',
      '{"a": [], "b": {}, "c": ""}', '[[[[1]]]]', '{"unicode": "h\u00e9llo \u4e16\u754c"}', '-0.5', '{"esc": "a\\"b\\\\c\\n"}',
      ' [1 ,2 , 3 ]'.strip(), '{"long": "' + "word " * 12 + '"}'],
     ['{"a" 1}', '[1, 2,]', '{a: 1}', 'tru', '[1 2]', '{"a": 1}}', '"unterminated', '01x', '{,}'])
G["arith"] = (r'''
start: sum
?sum: product | sum "+" product | sum "-" product
?product: atom | product "*" atom | product "/" atom
?atom: NUMBER | "-" atom | "(" sum ")" | NAME "(" [sum ("," sum)*] ")" | NAME
NAME: /[a-z_][a-z0-9_]*/
%import common.NUMBER
%import common.WS_INLINE
%ignore WS_INLINE
''', ['1+2*3', '(1 + 2) * 3', '-x / 4', 'max(1, 2, y)', 'f()', '((((7))))', '1.5e3 - 2', 'a*b+c*d-e/f', '--1', 'sin(x) * cos(y) + 1', 'x', '3 * (4 + 5) / 6'],
      ['1+', '(1+2', '1 ++ 2 *', '*3', 'f(,)', '1 2', '()', 'max(1,', ')'])
G["c_stmt"] = (r'''
start: stmt+
stmt: decl | assign | if_stmt | while_stmt | block | return_stmt | call ";"
decl: TYPE NAME ("=" expr)? ";"
assign: NAME ASSIGN_OP expr ";"
if_stmt: "if" "(" expr ")" stmt ("else" stmt)?
while_stmt: "while" "(" expr ")" stmt
return_stmt: "return" expr? ";"
block: "{" stmt* "}"
call: NAME "(" [expr ("," expr)*] ")"
?expr: expr BINOP term | term
?term: NUMBER | NAME | call | "(" expr ")" | "!" term | STRING
TYPE: "int" | "float" | "char" | "void"
ASSIGN_OP: "=" | "+=" | "-=" | "*="
BINOP: "+" | "-" | "*" | "/" | "<" | ">" | "==" | "!=" | "&&" | "||" | "<=" | ">="
STRING: /"[^"\\\n]*"/
NAME: /[a-zA-Z_][a-zA-Z0-9_]*/
NUMBER: /[0-9]+/
%import common.WS
%import common.CPP_COMMENT
%ignore WS
%ignore CPP_COMMENT
''', ['int x = 1;', 'x += 2;', 'if (x < 3) y = 4; else { z = 5; }', 'while (i != 10) { i += 1; print(i); }', 'return;',
      'float f;\nf = 2 * (3 + 4);', 'foo(1, "two", bar(3));', '{ { } }', 'int a; // comment\na = !a;', 'if (a && b || c) return a == b;',
      'char c = 65;', 'x = 1 <= 2;', 'int = 1;'],
      ['int x = = 1;', 'x += ;', 'if x < 3 y = 4;', 'while (1) ', 'return 1', 'int 1x;', '{ x = 1; ', 'foo(1,);', 'x = "a\nb";'])
G["sql"] = (r'''
start: select ";"?
select: "SELECT"i ("DISTINCT"i)? columns "FROM"i table_ref join* where? group? order? limit?
columns: "*" | column ("," column)*
column: expr ("AS"i NAME)?
table_ref: NAME (("AS"i)? NAME)?
join: ("INNER"i | "LEFT"i)? "JOIN"i table_ref "ON"i cond
where: "WHERE"i cond
group: "GROUP"i "BY"i expr ("," expr)*
order: "ORDER"i "BY"i expr ("ASC"i | "DESC"i)? ("," expr ("ASC"i | "DESC"i)?)*
limit: "LIMIT"i NUMBER
?cond: cond "OR"i cterm | cterm
?cterm: cterm "AND"i cfactor | cfactor
?cfactor: "NOT"i cfactor | expr CMP expr | "(" cond ")" | expr "IS"i "NULL"i
?expr: NAME ("." NAME)? | NUMBER | STRING | FUNC "(" (expr | "*") ")"
FUNC.2: "COUNT" | "SUM" | "AVG" | "MIN" | "MAX"
CMP: "=" | "<>" | "<" | ">" | "<=" | ">="
NAME: /[a-zA-Z_][a-zA-Z0-9_]*/
NUMBER: /[0-9]+/
STRING: /'[^']*'/
%import common.WS
%ignore WS
''', [], [])
# FUNC.2 -> priority unsupported by llguidance; drop priority
G["sql"] = (G["sql"][0].replace("FUNC.2:", "FUNC:"),
    ['SELECT * FROM t', 'select a, b from t where a = 1;', 'SELECT DISTINCT name FROM users u WHERE age >= 18 AND NOT active = 0',
     'SELECT u.name, COUNT(*) AS n FROM users AS u JOIN orders o ON u.id = o.uid GROUP BY u.name ORDER BY n DESC LIMIT 10',
     "SELECT x FROM t WHERE s = 'abc' OR (y < 3 AND z <> 4)", 'SELECT MAX(a) FROM t', 'SeLeCt a FrOm b',
     'SELECT a FROM t LEFT JOIN s ON t.a = s.b WHERE t.c IS NULL', 'SELECT a FROM t ORDER BY a ASC, b', 'SELECT 1 FROM dual;', 'SELECT a FROM t WHERE'],
    ['SELECT FROM t', 'SELECT * t', 'SELECT a, FROM t', 'SELECT a FROM t LIMIT x', "SELECT a FROM t WHERE s = 'x", 'INSERT INTO t'])
G["csv"] = (r'''
start: header row*
header: line
row: line
line: field ("," field)* NL
field: QUOTED | PLAIN |
QUOTED: /"([^"]|"")*"/
PLAIN: /[^,"\n]+/
NL: "\n"
''', ['a,b,c\n1,2,3\n', 'name\n"Smith, J"\n', 'x,y\n,\n"a""b",c\n', 'one\n', 'a,b\n1,\n,2\n', 'h\u00e9,w\n\u00fc,\u00f6\n',
      'q\n"multi\nline"\n', 'a,"",c\n', 'k,v\nkey one,value two\nkey2,value3\n', 'a\n\n'],
     ['a,b', 'a,"b\n', 'a,"b"c\n', '"x\n'])
G["lark"] = (r'''
start: (_item | _NL)*
_item: rule | term | directive
rule: RULE_NAME ":" expansions _NL
term: TERM_NAME ":" expansions _NL
directive: "%ignore" expansions _NL | "%import" IMPORT_PATH _NL
expansions: alias ("|" alias)*
alias: expansion ("->" RULE_NAME)?
expansion: expr*
expr: atom OP?
atom: "(" expansions ")" | "[" expansions "]" | RULE_NAME | TERM_NAME | STRING | REGEXP
RULE_NAME: /[?!]?[a-z_][a-z_0-9]*/
TERM_NAME: /_?[A-Z][_A-Z0-9]*/
IMPORT_PATH: /[a-z]+(\.[A-Z_a-z]+)+/
STRING: /"(\\.|[^"\\\n])*"i?/
REGEXP: /\/(\\.|[^\/\\\n])+\/[imslux]*/
OP: /[+*?]/
_NL: /(\r?\n)+/
%ignore /[ \t]+/
%ignore /\/\/[^\n]*/
''', ['start: a b\n', 'a: "x" | "y" -> why\n', 'NUM: /[0-9]+/\n', '%ignore WS\n', '%import common.WS\n', 'start: (a | b)* c?\na: "a"+\n',
      '\nstart: [x] y // comment\n', '?expr: expr "+" term | term\n', 'TERM: "ab"i\n', 'start: x\n\n\nx: /a\\/b/\n'],
     ['start a\n', 'a: "x"', 'a: (b\n', '%include x\n', 'A: "x\n'])
G["python_subset"] = (r'''
start: (stmt _NL)*
?stmt: assign | expr_stmt | "pass" | "return" expr? | "import" NAME ("," NAME)* | "from" NAME "import" NAME
assign: NAME ("," NAME)* "=" expr
expr_stmt: expr
?expr: or_test ("if" or_test "else" expr)?
?or_test: and_test ("or" and_test)*
?and_test: not_test ("and" not_test)*
?not_test: "not" not_test | comparison
?comparison: arith (COMP arith)*
?arith: term (ADDOP term)*
?term: factor (MULOP factor)*
?factor: "-" factor | power
?power: atom trailer*
trailer: "(" [arglist] ")" | "[" expr "]" | "." NAME
arglist: arg ("," arg)* ","?
arg: expr | NAME "=" expr
?atom: NAME | NUMBER | STRING | "(" [expr ("," expr)*] ")" | "[" [expr ("," expr)*] "]" | "{" [expr ":" expr ("," expr ":" expr)*] "}" | "None" | "True" | "False"
COMP: "<" | ">" | "==" | ">=" | "<=" | "!=" | "in" | "not in" | "is"
ADDOP: "+" | "-"
MULOP: "*" | "/" | "//" | "%"
NAME: /[a-zA-Z_]\w*/
NUMBER: /\d+(\.\d+)?/
STRING: /'[^'\n]*'|"[^"\n]*"/
_NL: /\n/
%ignore / +/
''', ['x = 1\n', 'a, b = f(1, k=2)\n', "print('hi')\n", 'import os, sys\nfrom a import b\n', 'y = [1, 2, 3][0] + d.e\n',
      'z = {1: 2, 3: 4}\n', 'pass\nreturn x if y else z\n', 'ok = not a and b or c\n', 'v = -x ** 2\n'.replace(' ** ', ' * '),
      's = "double"\n', 'n = a // b % c\n', 'r = x in y\n', 't = (1, 2)\n', 'f(a)(b)[c].d\n', 'import\n'],
     ['x = \n', 'def f():\n', 'x = (1\n', 'a b\n', 'x = 1', "s = 'unterminated\n"])
G["sexpr"] = (r'''
start: sexpr
?sexpr: atom | "(" sexpr* ")" | "'" sexpr
atom: SYMBOL | NUMBER | STRING
SYMBOL: /[a-zA-Z+\-*\/<>=!?][a-zA-Z0-9+\-*\/<>=!?]*/
NUMBER: /-?[0-9]+/
STRING: /"[^"]*"/
%ignore /[ \t\n]+/
''', ['(+ 1 2)', '(define (f x) (* x x))', "'(a b c)", '()', '(((a)))', 'foo', '-12', '(if (< x 0) "neg" "pos")', "(quote 'x)", '(lambda (x)\n  (+ x 1))'],
     ['(', '(a b', ')', '(a))', '"open', "'"])
G["kv_config"] = (r'''
start: (section | pair | _NL)*
section: "[" NAME "]" _NL
pair: NAME "=" value _NL
?value: NUMBER | BOOL | STRING | list
list: "[" [value ("," value)*] "]"
BOOL: "true" | "false"
NAME: /[a-z][a-z0-9_.]*/
NUMBER: /-?\d+(\.\d+)?/
STRING: /"[^"\n]*"/
_NL: /\n+/
%ignore /[ \t]+/
%ignore /#[^\n]*/
''', ['a = 1\n', '[server]\nhost = "x"\nport = 8080\n', 'flags = [true, false]\n', 'a = 1 # c\nname = "n" # t\n', 'x.y = -1.5\n',
      '[a]\n[b]\n', 'empty = []\n', 'nested = [[1], [2, 3]]\n', '\n\nk = "v"\n'],
     ['a = \n', '[sec\n', 'A = 1\n', 'x = tru\n', 'x = [1,\n', 'k = "v'])
G["dyck"] = (r'''
start: seq
seq: (pair)*
pair: "(" seq ")" | "[" seq "]" | "{" seq "}"
''', ['()', '([]{})', '{[()()]}', '', '((((((((()))))))))', '[][][]', '({[]})[]'],
     ['(', '(]', '([)]', '}', '(()', '{[}'])
G["left_rec"] = (r'''
start: list
list: list "," item | item
item: /[a-z]+/ | "(" list ")"
''', ['a', 'a,b,c', 'abc,(d,e),f', '((a))', 'x,' * 20 + 'y'],
     ['a,', ',a', 'a,,b', '(a', 'a b'])
G["right_rec"] = (r'''
start: list
list: item "," list | item
item: /[0-9]+/
''', ['1', '1,2,3', '10,20,30,40,50,60', '7,' * 15 + '8'], ['1,', ',', '1,,2', 'a'])
G["repeat_bounds"] = (r'''
start: word{2,4} tail?
word: /[a-z]+/ " "
tail: DIGIT~3
%import common.DIGIT
''', ['ab cd ', 'a b c d ', 'x y 123', 'aa bb cc 000'], ['a ', 'a b c d e ', 'a b 12', 'a b 1234', 'a  b '])
G["dates"] = (r'''
start: entry (";" entry)*
entry: DATE ("T" TIME)?
DATE: /[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])/
TIME: /([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9])?/
''', ['2024-01-31', '1999-12-01T23:59', '2024-02-29T00:00:00;2025-06-15', '0001-01-01'], ['2024-13-01', '2024-01-32', '2024-1-1', '2024-01-01T24:00', '2024-01-01;'])
G["case_insensitive"] = (r'''
start: "hello"i NAME "!"?
NAME: /[a-z]+/i
%ignore " "
''', ['hello world', 'HELLO World!', 'HeLLo x', 'hello   there !'], ['helo x', 'hello', 'hello 1', 'hi x'])
G["unicode"] = (r'''
start: greeting+
greeting: WORD PUNCT?
WORD: /[\u00c0-\u024f a-zA-Z\u4e00-\u9fff]+/
PUNCT: "\u3002" | "!" | "\u00bf" | "?"
''', ['hello', 'h\u00e9llo!', '\u4e16\u754c\u3002', 'na\u00efve caf\u00e9?', '\u00e0\u00e9\u00ee\u00f5\u00fc'], ['\u3002', '!!', '\u0400', '1'])
G["dot_any"] = (r'''
start: "<" TEXT ">" | "[" LINE "]"
TEXT: /[^<>]+/
LINE: /[^\]\n]+/
''', ['<anything at all \u00e9 \u4e16>', '[a]', '<multi\nline>', '[xy]'], ['<>', '<a<b>', '[]', '[a\nb]'])
G["lazy_tool"] = (r'''
start: (call | text)* end
end: /[a-z .]*/
text[lazy]: /[a-z ]*/ "<t"
call: text "ool>" NAME "</tool>"
NAME: /[a-z]+/
''', [], [])
G["lazy_tool"] = (r'''
start: chunk* FINAL
chunk: PREFIX "call>" NAME "</call>"
PREFIX[lazy]: /[a-z ]*<(.|\n)*/
NAME: /[a-z]+/
FINAL: /[a-z .]*/
''', [], [])
G["lazy_tool"] = (r'''
start: chunk* tail
chunk: head NAME ")"
head[lazy]: /[a-z ]*call\(/
tail: /[a-z .]*/
NAME: /[a-z]+/
''', ['no calls here.', 'please call(foo) then call(bar) done.', 'call(x)', ''], ['call(', 'call(x', 'call(1)'])
G["email_list"] = (r'''
start: addr ("," addr)*
addr: (NAME+ "<" EMAIL ">") | EMAIL
NAME: /[A-Z][a-z]+/
EMAIL: /[a-z0-9._%+-]+@[a-z0-9-]+(\.[a-z0-9-]+)*\.[a-z]{2,6}/
%ignore " "
''', ['a@b.co', 'John Smith <john.smith@example.com>', 'x@y.org, Ann <ann@z.io>', 'first.last+tag@sub.domain.travel'],
      ['a@b', '@b.com', 'John <john@x>', 'a@b.co,', 'john smith <j@x.com>'])
G["bool_logic"] = (r'''
start: expr
?expr: expr "||" conj | conj
?conj: conj "&&" neg | neg
?neg: "!" neg | atom
?atom: "true" | "false" | VAR | "(" expr ")" | VAR CMP NUMBER
CMP: "<" | ">" | "==" | "<=" | ">="
VAR: /[a-z]\w*/
NUMBER: /\d+/
%ignore " "
''', ['true', 'a && b', '!(x || y) && z', 'x < 3 || y == 4', '((a))', 'a<=10&&b>=2'], ['a &&', '!', '(a', 'a < b', 'true false'])
G["markdown_list"] = (r'''
start: item+
item: BULLET TEXT NL
BULLET: /(- |\* |[0-9]+\. )/
TEXT: /[^\n]+/
NL: "\n"
''', ['- one\n', '- one\n* two\n1. three\n', '10. ten\n'], ['one\n', '- one', '-one\n', '- \n'])
G["chess_pgn"] = (r'''
start: move_pair+ RESULT?
move_pair: MOVENUM " " SAN (" " SAN)? " "
MOVENUM: /[1-9][0-9]*\./
SAN: /([KQRBN]?[a-h]?[1-8]?x?[a-h][1-8](=[QRBN])?|O-O(-O)?)[+#]?/
RESULT: "1-0" | "0-1" | "1/2-1/2" | "*"
''', ['1. e4 e5 ', '1. e4 e5 2. Nf3 Nc6 3. Bb5 a6 1-0', '1. d4 d5 2. c4 dxc4 *', '1. O-O O-O-O ', '1. e8=Q+ '], ['1. e9 ', '1.e4 ', '1. e4 e5', '1. Zf3 '])
G["xml_like"] = (r'''
start: element
element: "<" NAME attr* ">" content* "</" NAME ">" | "<" NAME attr* "/>"
attr: " " NAME "=" VALUE
?content: element | TEXT
NAME: /[a-z][a-z0-9]*/
VALUE: /"[^"<]*"/
TEXT: /[^<]+/
''', ['<a></a>', '<a x="1"><b/>text</a>', '<root><c>hi</c><d k="v"/></root>', '<p>some \u00e9 text</p>'], ['<a>', '<a></', '<a x=1/>', '<A/>', 'text'])

os.makedirs(D, exist_ok=True)
n_valid = n_invalid = 0
for name, (g, valid, invalid) in G.items():
    assert valid and invalid, name
    open(f"{D}/{name}.lark", "w").write(g.lstrip("\n"))
    json.dump({"valid": valid, "invalid": invalid}, open(f"{D}/{name}.json", "w"), ensure_ascii=False, indent=1)
    n_valid += len(valid); n_invalid += len(invalid)
print(len(G), n_valid, n_invalid)
