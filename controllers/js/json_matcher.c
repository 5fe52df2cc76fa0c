/* The json controller's matcher.c, compiled into this controller for aici.JsonSchema (its sources stay in controllers/json). */
#include "../json/matcher.c"
