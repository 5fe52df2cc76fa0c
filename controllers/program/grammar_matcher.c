/* The grammar controller's matcher.c, compiled into this controller (its sources stay in controllers/grammar). */
#include "../grammar/matcher.c"
