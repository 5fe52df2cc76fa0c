/* The grammar controller's lark.c, compiled into this controller (its sources stay in controllers/grammar). */
#include "../grammar/lark.c"
