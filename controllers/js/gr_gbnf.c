/* The grammar controller's gbnf.c, compiled into this controller for aici.Grammar (its sources stay in controllers/grammar). */
#include "../grammar/gbnf.c"
