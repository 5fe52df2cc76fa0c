/* The json controller's keylang.c, compiled into this controller (its sources stay in controllers/json). */
#include "../json/keylang.c"
