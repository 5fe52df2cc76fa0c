/* The json controller's pattern.c, compiled into this controller for aici.JsonSchema (its sources stay in controllers/json). */
#include "../json/pattern.c"
