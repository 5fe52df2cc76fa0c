/* The grammar controller's json_term.c, compiled into this controller for aici.Grammar (its sources stay in controllers/grammar). */
#include "../grammar/json_term.c"
