/* The grammar controller's matcher.c, compiled into this controller for aici.Grammar (its sources stay in controllers/grammar). */
#include "../grammar/matcher.c"
