/* The grammar controller's grammar.c, compiled into this controller for aici.Grammar (its sources stay in controllers/grammar). */
#include "../grammar/grammar.c"
