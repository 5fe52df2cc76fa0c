/* The json controller's anyorder.c, compiled into this controller for %json{...} (its sources stay in controllers/json). */
#include "../json/anyorder.c"
