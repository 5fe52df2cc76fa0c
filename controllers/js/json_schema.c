/* The json controller's schema.c, compiled into this controller for aici.JsonSchema (its sources stay in controllers/json). */
#include "../json/schema.c"
