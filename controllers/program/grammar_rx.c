/* The grammar controller's rx.c, compiled into this controller (its sources stay in controllers/grammar). */
#include "../grammar/rx.c"
