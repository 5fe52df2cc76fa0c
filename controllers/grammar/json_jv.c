/* The json controller's jv.c, compiled into this controller for %json{...} (its sources stay in controllers/json). */
#include "../json/jv.c"
