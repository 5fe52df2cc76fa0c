/* The json controller's anyorder.c, compiled into this controller (its sources stay in controllers/json). */
#include "../json/anyorder.c"
