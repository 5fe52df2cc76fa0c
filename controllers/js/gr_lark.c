/* The grammar controller's lark.c, compiled into this controller for aici.Grammar (its sources stay in controllers/grammar). */
#include "../grammar/lark.c"
