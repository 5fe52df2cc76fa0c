/* The json controller's numeric.c, compiled into this controller for aici.JsonSchema (its sources stay in controllers/json). */
#include "../json/numeric.c"
