/* The grammar controller's grammar.c, compiled into this controller (its sources stay in controllers/grammar). */
#include "../grammar/grammar.c"
