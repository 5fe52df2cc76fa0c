/* The json controller's keylang.c, compiled into this controller for aici.JsonSchema (its sources stay in controllers/json). */
#include "../json/keylang.c"
