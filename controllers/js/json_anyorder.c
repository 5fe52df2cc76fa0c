/* The json controller's anyorder.c, compiled into this controller for aici.JsonSchema (its sources stay in controllers/json). */
#include "../json/anyorder.c"
