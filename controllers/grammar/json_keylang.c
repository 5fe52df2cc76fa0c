/* The json controller's keylang.c, compiled into this controller for %json{...} (its sources stay in controllers/json). */
#include "../json/keylang.c"
