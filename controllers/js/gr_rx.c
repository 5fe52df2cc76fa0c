/* The grammar controller's rx.c, compiled into this controller for aici.Grammar (its sources stay in controllers/grammar). */
#include "../grammar/rx.c"
