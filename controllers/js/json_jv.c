/* The json controller's jv.c, compiled into this controller for aici.JsonSchema (its sources stay in controllers/json). */
#include "../json/jv.c"
