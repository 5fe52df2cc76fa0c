/* The grammar controller's gbnf.c, compiled into this controller (its sources stay in controllers/grammar). */
#include "../grammar/gbnf.c"
